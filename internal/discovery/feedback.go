package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// Limits of POST /v1/feedback.
const (
	MaxFeedbackReports = 1000
	MaxFeedbackBytes   = 1 << 20
	// maxRetryAfterSeconds bounds a throttle: a day, as the longest ban cooldown.
	maxRetryAfterSeconds = 86400
)

// FeedbackSink takes the reports the feedback endpoint accepted (bans.Recorder).
type FeedbackSink interface {
	Add(proxy types.NamespacedName, r bans.Report)
}

// feedbackBody is the request body of POST /v1/feedback.
type feedbackBody struct {
	Reports []feedbackReport `json:"reports"`
}

type feedbackReport struct {
	// Proxy is the URL discovery handed out (with or without credentials) or
	// namespace/name.
	Proxy   string `json:"proxy"`
	Domain  string `json:"domain"`
	Outcome string `json:"outcome"`
	// RetryAfterSeconds is checked per report (retryAfter), so that a value out of range
	// or of another type rejects its report, not the whole body.
	RetryAfterSeconds json.RawMessage `json:"retryAfterSeconds,omitempty"`
}

// feedbackAnswer is the answer to a well-formed body.
type feedbackAnswer struct {
	Accepted int                `json:"accepted"`
	Rejected []feedbackRejected `json:"rejected"`
}

type feedbackRejected struct {
	Index int    `json:"index"`
	Proxy string `json:"proxy"`
	Error string `json:"error"`
}

// feedback serves POST /v1/feedback: crawler reports of bans, throttles and successes
// per proxy and domain, and of proxies that could not be reached at all (unreachable,
// for every site). Each report stands alone: the good ones are taken, each bad one
// is answered with its index and why; only a body that is not a list of reports at all
// is refused whole (400, or 413 when it is too large).
func (s *Server) feedback(w http.ResponseWriter, r *http.Request, c *access.Caller) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("method %s not allowed; use POST with a JSON body {\"reports\":[...]}", r.Method)})
		return
	}
	if len(r.URL.RawQuery) > 0 {
		writeError(w, &apiError{status: http.StatusBadRequest, Message: "/v1/feedback takes no query parameters; the reports go in the JSON body"})
		return
	}
	if s.opts.Feedback == nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "this server does not take feedback"})
		return
	}
	body, aerr := decodeFeedback(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	// Every report is resolved and authorized before any is taken, so a check that cannot
	// be made refuses the request with nothing recorded.
	keys := make([]types.NamespacedName, len(body.Reports))
	reports := make([]bans.Report, len(body.Reports))
	errs := make([]error, len(body.Reports))
	namespaces := make([]string, len(body.Reports))
	for i := range body.Reports {
		keys[i], reports[i], errs[i] = snap.resolveReport(&body.Reports[i])
		if errs[i] == nil {
			namespaces[i] = keys[i].Namespace
		}
	}
	refused, aerr := s.authorizeReports(r.Context(), c, namespaces)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	s.fbMu.RLock()
	defer s.fbMu.RUnlock()
	if s.draining {
		w.Header().Set("Retry-After", "1")
		writeError(w, &apiError{status: http.StatusServiceUnavailable, Message: "this replica is shutting down and takes no more feedback; send the reports again (another replica takes them)"})
		return
	}
	ans := feedbackAnswer{Rejected: []feedbackRejected{}}
	for i := range body.Reports {
		rep := &body.Reports[i]
		if errs[i] == nil && refused[i] != "" {
			errs[i] = errors.New(refused[i])
		}
		if errs[i] != nil {
			ans.Rejected = append(ans.Rejected, feedbackRejected{Index: i, Proxy: rep.Proxy, Error: errs[i].Error()})
			feedbackReports.WithLabelValues("rejected").Inc()
			continue
		}
		s.take(keys[i], reports[i])
		ans.Accepted++
	}
	b, _ := json.Marshal(ans) // ints and strings cannot fail
	writeBody(w, "application/json", append(b, '\n'))
}

// take hands one report to the sink and counts it.
func (s *Server) take(key types.NamespacedName, br bans.Report) {
	s.opts.Feedback.Add(key, br)
	feedbackReports.WithLabelValues(string(br.Outcome)).Inc()
}

// decodeFeedback reads and checks the body as a whole.
func decodeFeedback(w http.ResponseWriter, r *http.Request) (*feedbackBody, *apiError) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxFeedbackBytes))
	dec.DisallowUnknownFields()
	var body feedbackBody
	err := dec.Decode(&body)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	} else if err == nil {
		if _, e := dec.Token(); !errors.Is(e, io.EOF) {
			err = errors.New("data after the JSON object")
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("the feedback body is larger than %d bytes; send at most %d reports per request", MaxFeedbackBytes, MaxFeedbackReports)}
	case errors.Is(err, io.EOF):
		return nil, &apiError{status: http.StatusBadRequest, Message: `the feedback body is empty; send {"reports":[{"proxy":...,"domain":...,"outcome":...}]}`}
	case err != nil && nonFinite(err):
		return nil, &apiError{status: http.StatusBadRequest, Message: "the feedback body is not JSON: " + err.Error() +
			"; JSON has no Infinity or NaN: leave retryAfterSeconds out or give a number of seconds from 0 to " + strconv.Itoa(maxRetryAfterSeconds)}
	case err != nil:
		return nil, &apiError{status: http.StatusBadRequest, Message: "the feedback body is not a JSON object {\"reports\":[...]}: " + err.Error()}
	case len(body.Reports) == 0:
		return nil, &apiError{status: http.StatusBadRequest, Message: `the feedback body has no reports; send {"reports":[{"proxy":...,"domain":...,"outcome":...}]}`}
	case len(body.Reports) > MaxFeedbackReports:
		return nil, &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf("the feedback body has %d reports; send at most %d per request", len(body.Reports), MaxFeedbackReports)}
	}
	return &body, nil
}

// nonFinite reports whether err is the decoder's at an Infinity or NaN, which some
// encoders (Python's json) write for non-finite numbers.
func nonFinite(err error) bool {
	var se *json.SyntaxError
	m := err.Error()
	return errors.As(err, &se) && (strings.Contains(m, "character 'I'") || strings.Contains(m, "character 'N'"))
}

// resolveReport checks one report and finds its proxy in the snapshot.
func (s *Snapshot) resolveReport(rep *feedbackReport) (types.NamespacedName, bans.Report, error) {
	var none types.NamespacedName
	it := s.proxyByRef(rep.Proxy)
	if it == nil {
		return none, bans.Report{}, fmt.Errorf("unknown proxy %q: give the URL discovery handed out or namespace/name of a published proxy", rep.Proxy)
	}
	o, err := bans.ParseOutcome(rep.Outcome)
	if err != nil {
		return none, bans.Report{}, fmt.Errorf("outcome: %w", err)
	}
	// unreachable is about the proxy, for every site: its domain may be left out, and
	// one given is checked like any other and then not used.
	var site string
	if o != bans.Unreachable || rep.Domain != "" {
		if site, err = bans.Site(rep.Domain); err != nil {
			return none, bans.Report{}, fmt.Errorf("domain: %w", err)
		}
	}
	if o == bans.Unreachable {
		site = ""
	}
	br := bans.Report{Site: site, Outcome: o}
	if br.RetryAfter, err = retryAfter(rep.RetryAfterSeconds); err != nil {
		return none, bans.Report{}, err
	}
	return types.NamespacedName{Namespace: it.Namespace, Name: it.Name}, br, nil
}

// retryAfter parses a report's retryAfterSeconds: absent or null is zero; anything but a
// number from 0 to maxRetryAfterSeconds (a number too large for a float64 too) is an
// error naming the field.
func retryAfter(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	bad := fmt.Errorf("retryAfterSeconds %.40s: give a number of seconds from 0 to %d", raw, maxRetryAfterSeconds)
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') { // a string, a bool, an object
		return 0, bad
	}
	ra, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || ra < 0 || ra > maxRetryAfterSeconds || math.IsNaN(ra) {
		return 0, bad
	}
	return time.Duration(ra * float64(time.Second)), nil
}

// proxyByRef finds a proxy by namespace/name or by its URL (any user:password@ in it
// ignored).
func (s *Snapshot) proxyByRef(ref string) *item {
	if it := s.byName[ref]; it != nil {
		return it
	}
	if u, err := url.Parse(ref); err == nil && u.Host != "" {
		return s.byURL[strings.ToLower(u.Scheme)+"://"+strings.ToLower(u.Host)]
	}
	return nil
}

// coolingFor reports whether the item is cooling for site at now.
func (it *item) coolingFor(site string, now time.Time) bool {
	_, cooling := bans.CoolingUntil(it.cooldowns, site, now)
	return cooling
}

// indexFeedback builds the look-ups feedback and ?domain= need: items by name and by URL,
// and the items holding a cooldown, by site.
func (s *Snapshot) indexFeedback() {
	s.byName = make(map[string]*item, len(s.items))
	s.byURL = make(map[string]*item, len(s.items))
	s.bySite = map[string][]*item{}
	for i := range s.items {
		it := &s.items[i]
		s.byName[it.Namespace+"/"+it.Name] = it
		if _, ok := s.byURL[it.URL]; !ok {
			s.byURL[it.URL] = it
		}
		for _, c := range it.cooldowns {
			s.bySite[c.Site] = append(s.bySite[c.Site], it)
		}
		if !it.Healthy {
			continue
		}
		s.healthy++
	}
}

// saturation counts, for a request filtered by f with a ?domain=, the proxies it
// matches whatever their cooldowns and those of them cooling for its site, with the
// soonest end of those cooldowns. It also gives f the site's candidates (the proxies not
// cooling for it), which every scan of the request then goes over instead of all items.
func (s *Snapshot) saturation(f *filter) (matched, cooling int, soonest time.Time) {
	g := *f
	g.site = ""
	sc := s.siteCooling(f.site, f.now)
	f.cands, f.candsSet = sc.cands, true
	if g.empty() {
		return s.healthy, sc.healthy, sc.healthySoonest
	}
	for _, it := range s.all {
		if g.match(it) {
			matched++
		}
	}
	for _, c := range sc.items {
		if !g.match(c.it) {
			continue
		}
		cooling++
		if soonest.IsZero() || c.until.Before(soonest) {
			soonest = c.until
		}
	}
	return matched, cooling, soonest
}

// siteCool is which proxies of a snapshot cool for one site, worked out at from and
// true until validUntil, the soonest end among their cooldowns: a snapshot's cooldowns
// only end (a new one comes with a new snapshot), so in between the set stays as it is.
// A zero validUntil holds for good: nothing cools, and nothing can start to.
type siteCool struct {
	// cands is the snapshot's items not cooling for the site, in snapshot order: what
	// a request for the site scans, so that it does a plain request's work over fewer
	// items. With nothing cooling, it is Snapshot.all itself.
	cands          []*item
	items          []coolingItem // the cooling ones
	healthy        int           // how many of them are healthy
	healthySoonest time.Time     // the soonest end among the healthy ones
	from           time.Time
	validUntil     time.Time
}

type coolingItem struct {
	it    *item
	until time.Time
}

// holds reports whether sc is still the answer at now.
func (sc *siteCool) holds(now time.Time) bool {
	return !now.Before(sc.from) && (sc.validUntil.IsZero() || now.Before(sc.validUntil))
}

// siteCooling is the site's siteCool at now, from the snapshot's cache while it holds.
func (s *Snapshot) siteCooling(site string, now time.Time) *siteCool {
	held := s.bySite[site]
	if len(held) == 0 {
		return s.noneCooling // no proxy has a cooldown for the site, whatever the time
	}
	if v, ok := s.cooling.Load(site); ok {
		if sc := v.(*siteCool); sc.holds(now) {
			return sc
		}
	}
	sc := &siteCool{from: now, items: make([]coolingItem, 0, len(held))}
	for _, it := range held {
		until, cool := bans.CoolingUntil(it.cooldowns, site, now)
		if !cool {
			continue
		}
		sc.items = append(sc.items, coolingItem{it, until})
		if sc.validUntil.IsZero() || until.Before(sc.validUntil) {
			sc.validUntil = until
		}
		if it.Healthy {
			sc.healthy++
			if sc.healthySoonest.IsZero() || until.Before(sc.healthySoonest) {
				sc.healthySoonest = until
			}
		}
	}
	if len(sc.items) == 0 {
		sc.cands = s.all
	} else {
		out := make([]uint64, (len(s.items)+63)/64) // by item index; only while building
		for _, c := range sc.items {
			out[c.it.idx>>6] |= 1 << (uint(c.it.idx) & 63)
		}
		sc.cands = make([]*item, 0, len(s.items)-len(sc.items))
		for _, it := range s.all {
			if out[it.idx>>6]&(1<<(uint(it.idx)&63)) == 0 {
				sc.cands = append(sc.cands, it)
			}
		}
	}
	s.cooling.Store(site, sc)
	return sc
}

// saturated stamps a ?domain= request's filter with the time its cooldowns are judged
// at, and returns the 503 with Retry-After when more than the allowed share of the
// proxies matching the request are cooling for its site: handing the crawl to the last
// few would only get them banned too. nil: not saturated.
func (s *Server) saturated(ctx context.Context, snap *Snapshot, f *filter, endpoint string) *apiError {
	if f.site == "" {
		return nil
	}
	f.now = s.opts.Clock.Now()
	matched, cooling, soonest := snap.saturation(f)
	if cooling == 0 {
		return nil
	}
	pct := s.maxCoolingPercent(ctx, snap, f)
	if !bans.Saturated(cooling, matched, pct) {
		return nil
	}
	saturatedAnswers.WithLabelValues(endpoint).Inc()
	retry := max(1, int(math.Ceil(soonest.Sub(f.now).Seconds())))
	return &apiError{status: http.StatusServiceUnavailable, Parameter: paramDomain, retryAfter: retry, site: f.site,
		Message: fmt.Sprintf("site %s is saturated: %d of the %d proxies matching the request are cooling for it, more than %d%%; retry in %ds, when the first cooldown ends",
			f.site, cooling, matched, pct, retry)}
}

// maxCoolingPercent is the saturation threshold of a request: that of the pool it names
// with ?pool= (looked up in ?namespace=, or the namespace of the first proxy it matches),
// else the server's.
func (s *Server) maxCoolingPercent(ctx context.Context, snap *Snapshot, f *filter) int {
	pct := s.opts.MaxCoolingPercent
	if pct <= 0 {
		pct = bans.DefaultMaxCoolingPercent
	}
	if f.pool == "" || s.opts.PoolBans == nil {
		return pct
	}
	ns := f.namespace
	if ns == "" {
		g := *f
		g.site = ""
		for i := range snap.items {
			if g.match(&snap.items[i]) {
				ns = snap.items[i].Namespace
				break
			}
		}
	}
	if b := s.opts.PoolBans(ctx, types.NamespacedName{Namespace: ns, Name: f.pool}); b != nil && b.MaxCoolingPercent != nil {
		return int(*b.MaxCoolingPercent)
	}
	return pct
}

// cooldownsOf is what discovery keeps of a Proxy's cooldowns.
func cooldownsOf(px *v1alpha1.Proxy) []v1alpha1.ProxyCooldown {
	if len(px.Status.Cooldowns) == 0 {
		return nil
	}
	return append([]v1alpha1.ProxyCooldown(nil), px.Status.Cooldowns...)
}
