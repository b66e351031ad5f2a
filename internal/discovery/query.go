package discovery

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/labels"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// Query parameters. Every endpoint rejects a parameter it does not know, so a typo
// (?zones=a) is an error rather than a silently unfiltered answer.
const (
	paramNamespace     = "namespace"
	paramProvider      = "provider"
	paramZone          = "zone"
	paramRegion        = "region"
	paramLabelSelector = "labelSelector"
	paramHealthy       = "healthy"
	paramFormat        = "format"
	paramKey           = "key"
	paramCredentials   = "credentials"
	paramPool          = "pool"
	paramDomain        = "domain"
	// paramDistinctEgress=true lists at most one proxy per egress address.
	paramDistinctEgress = "distinctEgress"
	// paramIPFamily 4 (default) or 6: which of a proxy's addresses its URL uses.
	paramIPFamily = "ipFamily"
	// paramExclude leaves proxies out of one answer: each the URL discovery handed out
	// or namespace/name, the parameter repeated or the entries comma-separated.
	paramExclude = "exclude"
)

// maxExclude bounds the entries of paramExclude in one request.
const maxExclude = 100

const (
	formatJSON = "json"
	formatText = "text"
)

// request is a parsed query.
type request struct {
	filter filter
	format string
	key    string
	// rotation chooses without a key (Snapshot.rotate): Choose's, never a query's.
	rotation    uint64
	credentials bool // each URL with user:password@
	// distinctEgress: one proxy per egress identity (Snapshot.distinctEgress).
	distinctEgress bool
	ipv6           bool // ?ipFamily=6
	// exclude is ?exclude='s entries, checked for form (resolved by Snapshot.excluded).
	exclude []string
}

// parseQuery parses q for an endpoint that accepts the parameters in allowed.
func parseQuery(q url.Values, allowed ...string) (*request, *apiError) {
	for name := range q {
		if !contains(allowed, name) {
			return nil, badParam(name, fmt.Sprintf("unknown parameter %q; this endpoint accepts %s", name, strings.Join(allowed, ", ")))
		}
	}
	for name, vs := range q {
		if len(vs) > 1 && name != paramExclude {
			return nil, badParam(name, fmt.Sprintf("parameter %q given %d times; give it once", name, len(vs)))
		}
	}
	r := &request{
		filter: filter{
			namespace: q.Get(paramNamespace),
			provider:  q.Get(paramProvider),
			zone:      q.Get(paramZone),
			region:    q.Get(paramRegion),
			pool:      q.Get(paramPool),
		},
		format: formatJSON,
		key:    q.Get(paramKey),
	}
	if s := q.Get(paramLabelSelector); s != "" {
		sel, err := labels.Parse(s)
		if err != nil {
			return nil, badParam(paramLabelSelector, fmt.Sprintf("invalid label selector %q: %v", s, err))
		}
		if !sel.Empty() {
			r.filter.selector = sel
		}
	}
	if d := q.Get(paramDomain); d != "" {
		site, err := siteOf(d)
		if err != nil {
			return nil, badParam(paramDomain, err.Error())
		}
		r.filter.site = site
	}
	if vs, ok := q[paramExclude]; ok {
		ex, aerr := parseExclude(vs)
		if aerr != nil {
			return nil, aerr
		}
		r.exclude = ex
	}
	switch h := q.Get(paramHealthy); h {
	case "", "true":
	case "any":
		r.filter.anyHealth = true
	case "false":
		r.filter.unhealthyOnly = true
	default:
		return nil, badParam(paramHealthy, fmt.Sprintf("invalid value %q for healthy: use true (the default), false or any", h))
	}
	switch c := q.Get(paramCredentials); c {
	case "", "false":
	case "true":
		r.credentials = true
	default:
		return nil, badParam(paramCredentials, fmt.Sprintf("invalid value %q for credentials: use true or false (the default)", c))
	}
	switch d := q.Get(paramDistinctEgress); d {
	case "", "false":
	case "true":
		r.distinctEgress = true
	default:
		return nil, badParam(paramDistinctEgress, fmt.Sprintf("invalid value %q for distinctEgress: use true or false (the default)", d))
	}
	switch fam := q.Get(paramIPFamily); fam {
	case "", "4":
	case "6":
		r.ipv6 = true
	default:
		return nil, badParam(paramIPFamily, fmt.Sprintf("invalid value %q for ipFamily: use 4 (the default) or 6", fam))
	}
	switch f := q.Get(paramFormat); f {
	case "", formatJSON:
	case formatText:
		r.format = formatText
	default:
		return nil, badParam(paramFormat, fmt.Sprintf("invalid value %q for format: use json (the default) or text", f))
	}
	return r, nil
}

// parseExclude splits ?exclude='s values at commas and checks each entry's form: a URL
// with a host (http://10.0.0.5:3128, any user:password@ in it ignored) or
// namespace/name. Whether the entry names a proxy is not checked: one that names none
// excludes nothing.
func parseExclude(vs []string) ([]string, *apiError) {
	var out []string
	for _, v := range vs {
		for e := range strings.SplitSeq(v, ",") {
			e = strings.TrimSpace(e)
			if len(out) == maxExclude {
				return nil, badParam(paramExclude, fmt.Sprintf("more than %d entries in exclude; leave out at most %d proxies per request", maxExclude, maxExclude))
			}
			if err := checkProxyRef(e); err != "" {
				return nil, badParam(paramExclude, fmt.Sprintf("invalid exclude entry %.80q: %s; give the URL discovery handed out (http://host:port) or namespace/name, several comma-separated or exclude repeated", e, err))
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// checkProxyRef says what is wrong with ref as a proxy's URL or namespace/name, or "".
func checkProxyRef(ref string) string {
	if ref == "" {
		return "empty"
	}
	if strings.Contains(ref, "://") {
		u, err := url.Parse(ref)
		switch {
		case err != nil:
			return "not a URL"
		case u.Host == "":
			return "a URL without a host"
		}
		return ""
	}
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "neither a URL nor namespace/name"
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sites caches bans.Site's answers for the domains requests name: a crawl asks for the
// same few sites over and over, and the public-suffix look-up is most of a ?domain=
// request's own cost. It is keyed by the domain as Site reads it (lower case, no
// trailing dot) and holds only domains Site took, so no key is longer than a DNS name;
// keys and sites are copies, never parts of a request's query that they would keep in
// memory. Past maxSites entries it starts over, so that it follows the sites crawled now:
// at most maxSites × (2 × 253 bytes and the map's overhead), under 3 MiB.
var (
	sites     sync.Map // domain -> site
	sitesHeld atomic.Int32
)

const maxSites = 4096

func siteOf(domain string) (string, error) {
	if len(domain) > bans.MaxNameLength+1 { // with a trailing dot: refused below
		return bans.Site(domain)
	}
	key := strings.TrimSuffix(strings.ToLower(domain), ".")
	if v, ok := sites.Load(key); ok {
		return v.(string), nil
	}
	site, err := bans.Site(domain)
	if err != nil {
		return "", err
	}
	if sitesHeld.Add(1) > maxSites {
		sites.Clear()
		sitesHeld.Store(1)
	}
	sites.Store(strings.Clone(key), strings.Clone(site))
	return site, nil
}
