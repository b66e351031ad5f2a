package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// errNoTokenForCredentials answers ?credentials=true on a server without a token: the
// credentials would go to anyone who can reach the API.
var errNoTokenForCredentials = &apiError{status: http.StatusForbidden, Parameter: paramCredentials,
	Message: "credentials are served only to callers authenticated with the discovery token, and this server has no token configured (--discovery-token-file)"}

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

// credentialed answers a request with ?credentials=true: the entries of items f matches,
// with credentials, as a list (JSON or text) or, for pick, the one item.
func (s *Server) credentialed(w http.ResponseWriter, r *http.Request, req *request, items []*item, single bool) {
	entries := make([]Entry, 0, len(items))
	for _, it := range items {
		e, aerr := s.withCredentials(r.Context(), it.Entry)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		entries = append(entries, e)
	}
	if req.format == formatText {
		var b strings.Builder
		for _, e := range entries {
			b.WriteString(e.URL + "\n")
		}
		writeBody(w, "text/plain; charset=utf-8", []byte(b.String()))
		return
	}
	if single {
		b, _ := json.Marshal(entries[0]) // strings, bools and a string map cannot fail
		writeBody(w, "application/json", append(b, '\n'))
		return
	}
	// The same encoding as the list without credentials, over the entries as they are.
	writeBody(w, "application/json", NewSnapshot(entries).appendJSON(nil, &filter{anyHealth: true}))
}
