package discovery

import (
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

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// POST /v1/feedback: the crawlers' reports, checked one by one and handed to the
// FeedbackSink (bans.Recorder), which writes them into the Proxies' cooldowns. The
// ?domain= cooling index that reads those cooldowns back is in domain_cooling.go.

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
