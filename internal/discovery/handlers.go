package discovery

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) *Snapshot {
	snap, err := s.src.Snapshot(r.Context())
	if err != nil {
		s.opts.Log.Error(err, "discovery api: reading proxies")
		writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "proxies are not available yet: " + err.Error()})
		return nil
	}
	return snap
}

// list serves GET /v1/proxies.
func (s *Server) list(w http.ResponseWriter, r *http.Request, c *access.Caller) {
	req, aerr := parseQuery(r.URL.Query(), paramNamespace, paramProvider, paramZone, paramRegion,
		paramLabelSelector, paramHealthy, paramFormat, paramCredentials, paramPool, paramDomain, paramDistinctEgress, paramIPFamily,
		paramExclude)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.credentials && c == nil {
		writeError(w, errNoTokenForCredentials)
		return
	}
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	all := snap
	snap = snap.family(req.ipv6)
	if aerr := s.authorizeRead(r.Context(), c, snap, req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.saturated(r.Context(), snap, &req.filter, endpointList); aerr != nil {
		writeError(w, aerr)
		return
	}
	req.filter.exclude = all.excluded(req.exclude, snap)
	if req.distinctEgress {
		req.filter.only = snap.distinctEgress(&req.filter)
	}
	if req.credentials {
		s.credentialed(w, r, req, snap.matching(&req.filter))
		return
	}
	if req.filter.empty() { // the common request: precomputed at snapshot time
		if req.format == formatText {
			writeBody(w, "text/plain; charset=utf-8", snap.healthyText)
		} else {
			writeBody(w, "application/json", snap.healthyJSON)
		}
		return
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	if req.format == formatText {
		*bp = snap.appendText((*bp)[:0], &req.filter)
		writeBody(w, "text/plain; charset=utf-8", *bp)
	} else {
		*bp = snap.appendJSON((*bp)[:0], &req.filter)
		writeBody(w, "application/json", *bp)
	}
}

// pick serves GET /v1/proxies/pick?key=K: one healthy proxy, the same one for the same
// key while it stays healthy. With ?exclude=, the best for the key among the others: a
// client retrying a request gets the next proxy in the key's rendezvous order.
func (s *Server) pick(w http.ResponseWriter, r *http.Request, c *access.Caller) {
	req, aerr := parseQuery(r.URL.Query(), paramKey, paramNamespace, paramProvider, paramZone, paramRegion,
		paramLabelSelector, paramFormat, paramCredentials, paramPool, paramDomain, paramIPFamily, paramExclude)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.credentials && c == nil {
		writeError(w, errNoTokenForCredentials)
		return
	}
	if req.key == "" {
		req.key = req.filter.site // a crawl of one site sticks to one proxy while it can
	}
	if req.key == "" {
		writeError(w, badParam(paramKey, "missing required parameter key (the session key to pick a proxy for; or domain, whose site is then the key)"))
		return
	}
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	ch, aerr := s.choose(r.Context(), snap, req, func(fam *Snapshot) *apiError { return s.authorizeRead(r.Context(), c, fam, req) }, endpointPick)
	if ch.credentialsRead {
		credentialsUnavailable.WithLabelValues(endpointPick).Add(float64(len(ch.failed)))
		w.Header().Set(credentialsUnavailableHeader, strconv.Itoa(len(ch.failed)))
	}
	if aerr != nil {
		// Nothing matched (not a refusal of the caller, nor a saturated site): a pool at zero?
		if strings.HasPrefix(aerr.Message, ErrNoProxy.Error()) && aerr.retryAfter == 0 && req.filter.pool != "" && s.opts.Pools != nil {
			if pool, ok := s.zeroPool(r.Context(), c, snap, req); ok {
				if s.opts.Demand != nil {
					s.opts.Demand.Picked(pool, true)
				}
				aerr = zeroPoolError(pool)
			}
		}
		writeError(w, aerr)
		return
	}
	if s.opts.Demand != nil && ch.it.Pool != "" {
		s.opts.Demand.Picked(types.NamespacedName{Namespace: ch.it.Namespace, Name: ch.it.Pool}, false)
	}
	if !req.credentials {
		if req.format == formatText {
			writeBody(w, "text/plain; charset=utf-8", ch.it.line)
			return
		}
		writeBody(w, "application/json", ch.it.obj)
		return
	}
	if req.format == formatText {
		writeBody(w, "text/plain; charset=utf-8", []byte(ch.entry.URL+"\n"))
		return
	}
	b, _ := json.Marshal(ch.entry) // strings, bools and a string map cannot fail
	writeBody(w, "application/json", append(b, '\n'))
}

func writeBody(w http.ResponseWriter, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(body)
}

// whoami answers with the caller's address, as {"ip":"..."} or, with ?format=text or
// Accept: text/plain, as the bare address. Pointed at through a proxy, it reports the
// proxy's egress address, which the health engine records.
func whoami(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if r.URL.Query().Get(paramFormat) == formatText || strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
		writeBody(w, "text/plain; charset=utf-8", []byte(host+"\n"))
		return
	}
	writeBody(w, "application/json", []byte(`{"ip":"`+host+`"}`+"\n"))
}
