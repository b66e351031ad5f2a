package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// errNoTokenForCredentials answers ?credentials=true on a server without
// authentication: the credentials would go to anyone who can reach the API.
var errNoTokenForCredentials = &apiError{status: http.StatusForbidden, Parameter: paramCredentials,
	Message: "credentials are served only to authenticated callers, and this server has no authentication configured (--discovery-kubernetes-auth or --discovery-token-file)"}

// withCredentials is e with its URL carrying the user:password@ its proxy demands (for
// a Managed Proxy the snapshot of what its instance was built with), or e as it is when
// the proxy demands none.
func (s *Server) withCredentials(ctx context.Context, e Entry) (Entry, *apiError) {
	c, aerr := s.credentialsOf(ctx, e)
	if aerr != nil {
		return e, aerr
	}
	return withUser(e, c)
}

// withUser is e with c's user:password@ in its URL; e as it is when c is nil.
func withUser(e Entry, c *proxyconfig.Credentials) (Entry, *apiError) {
	if c == nil {
		return e, nil
	}
	u, err := url.Parse(e.URL)
	if err != nil { // EntryFor writes http://host:port, which parses
		return e, credentialsUnavailableError(e, fmt.Sprintf("parsing its url: %v", err))
	}
	u.User = url.UserPassword(c.Username, c.Password)
	e.URL = u.String()
	return e, nil
}

// credentialsOf is the user name and password e's proxy demands (for a Managed Proxy the
// snapshot of what its instance was built with), nil when it demands none.
func (s *Server) credentialsOf(ctx context.Context, e Entry) (*proxyconfig.Credentials, *apiError) {
	if e.auth == nil {
		return nil, nil
	}
	if s.opts.Credentials == nil {
		return nil, credentialsUnavailableError(e, "this server cannot read proxy credentials")
	}
	c, err := s.opts.Credentials(ctx, e.auth)
	if err != nil {
		return nil, credentialsUnavailableError(e, err.Error())
	}
	return c, nil
}

func credentialsUnavailableError(e Entry, why string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, Message: fmt.Sprintf("credentials of proxy %s/%s: %s", e.Namespace, e.Name, why)}
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
