package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// errNoTokenForCredentials answers ?credentials=true on a server without
// authentication: the credentials would go to anyone who can reach the API.
var errNoTokenForCredentials = &apiError{status: http.StatusForbidden, Parameter: paramCredentials,
	Message: "credentials are served only to authenticated callers, and this server has no authentication configured (--discovery-kubernetes-auth or --discovery-token-file)"}

// withCredentials is e with its URL carrying the user:password@ its proxy demands (for
// a Managed Proxy the snapshot of what its instance was built with), or e as it is when
// the proxy demands none.
func (s *Server) withCredentials(ctx context.Context, e Entry) (Entry, *apiError) {
	if e.auth == nil {
		return e, nil
	}
	unavailable := func(why string) *apiError {
		return &apiError{status: http.StatusServiceUnavailable, Message: fmt.Sprintf("credentials of proxy %s/%s: %s", e.Namespace, e.Name, why)}
	}
	if s.opts.Credentials == nil {
		return e, unavailable("this server cannot read proxy credentials")
	}
	c, err := s.opts.Credentials(ctx, e.auth)
	if err != nil {
		return e, unavailable(err.Error())
	}
	if c == nil {
		return e, nil
	}
	u, err := url.Parse(e.URL)
	if err != nil { // EntryFor writes http://host:port, which parses
		return e, unavailable(fmt.Sprintf("parsing its url: %v", err))
	}
	u.User = url.UserPassword(c.Username, c.Password)
	e.URL = u.String()
	return e, nil
}

// credentialsUnavailableHeader carries, on every ?credentials=true answer, how many
// proxies were left out because their credentials could not be read (the text format
// has no field for it).
const credentialsUnavailableHeader = "X-Credentials-Unavailable"

// credentialed answers a list request with ?credentials=true: the entries of items, each
// with its credentials, as a list (JSON or text). A proxy whose credentials cannot be read
// is left out rather than failing the answer: the JSON list counts such proxies in
// credentialsUnavailable and gives each one's reason (naming that proxy alone) in
// credentialErrors; both formats carry the count in X-Credentials-Unavailable, and the
// metric proxy_operator_discovery_credentials_unavailable_total counts them too.
func (s *Server) credentialed(w http.ResponseWriter, r *http.Request, req *request, items []*item) {
	entries := make([]Entry, 0, len(items))
	var failed []string
	for _, it := range items {
		e, aerr := s.withCredentials(r.Context(), it.Entry)
		if aerr != nil {
			failed = append(failed, aerr.Message)
			continue
		}
		entries = append(entries, e)
	}
	credentialsUnavailable.WithLabelValues(endpointList).Add(float64(len(failed)))
	w.Header().Set(credentialsUnavailableHeader, strconv.Itoa(len(failed)))
	if req.format == formatText {
		var b strings.Builder
		for _, e := range entries {
			b.WriteString(e.URL + "\n")
		}
		writeBody(w, "text/plain; charset=utf-8", []byte(b.String()))
		return
	}
	// The same encoding as the list without credentials, over the entries as they are,
	// and the proxies left out.
	b := newSnapshot(entries).appendJSON(nil, &filter{anyHealth: true})
	b = append(b[:len(b)-len("}\n")], `,"credentialsUnavailable":`...)
	b = strconv.AppendInt(b, int64(len(failed)), 10)
	if len(failed) > 0 {
		errs, _ := json.Marshal(failed) // strings cannot fail
		b = append(append(b, `,"credentialErrors":`...), errs...)
	}
	writeBody(w, "application/json", append(b, "}\n"...))
}

// pickCredentialed answers a pick with ?credentials=true: the proxy the key picks among
// those whose credentials can be read. One whose credentials cannot be read is passed
// over as an unhealthy one would be, and the key goes to the next proxy in its rendezvous
// order (counted in X-Credentials-Unavailable and the metric); when none is left, the
// answer is 503 naming the proxies passed over and why.
func (s *Server) pickCredentialed(w http.ResponseWriter, r *http.Request, req *request, snap *Snapshot) {
	var failed []string
	skip := map[*item]bool{}
	for {
		it := snap.pick(req.key, &req.filter, skip)
		if it == nil {
			credentialsUnavailable.WithLabelValues(endpointPick).Add(float64(len(failed)))
			msg := "no healthy proxy matches the request"
			if len(failed) > 0 {
				msg += fmt.Sprintf(" with readable credentials (%d left out: %s)", len(failed), strings.Join(failed, "; "))
			}
			w.Header().Set(credentialsUnavailableHeader, strconv.Itoa(len(failed)))
			writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: msg})
			return
		}
		e, aerr := s.withCredentials(r.Context(), it.Entry)
		if aerr != nil {
			failed = append(failed, aerr.Message)
			skip[it] = true
			continue
		}
		credentialsUnavailable.WithLabelValues(endpointPick).Add(float64(len(failed)))
		w.Header().Set(credentialsUnavailableHeader, strconv.Itoa(len(failed)))
		if req.format == formatText {
			writeBody(w, "text/plain; charset=utf-8", []byte(e.URL+"\n"))
			return
		}
		b, _ := json.Marshal(e) // strings, bools and a string map cannot fail
		writeBody(w, "application/json", append(b, '\n'))
		return
	}
}
