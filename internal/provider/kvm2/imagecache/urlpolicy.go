package imagecache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// The image URL policy. A URL given in a Proxy's placement.image is the tenant's: whoever may
// create a Proxy would otherwise make the operator fetch any address it can reach and read
// the answer back from the Proxy's status. The catalogue's URLs are the cluster admin's and
// pass unchecked. A checked request carries its urlPolicy in its context, where the image
// client's dialer, proxy choice and redirect check find it:
//
//   - with allowedImageURLPrefixes set, the URL and every redirect target must lie under
//     one of the prefixes, and are then fetched from whatever address the name has
//     (the admin named the server, a LAN mirror included) except the metadata addresses;
//   - without it, every connection, redirects included, is checked on the address it
//     actually goes to: never loopback, link-local, unspecified or cloud metadata.
//     Checking the resolved address at dial time, and dialling exactly that address, is
//     what defeats a name that resolves elsewhere the second time (DNS rebinding).

// urlPolicy is the policy of one checked fetch.
type urlPolicy struct {
	// block is the provider's config block (kvm2 or kvm), for messages.
	block string
	// host is the placement.image URL's host, which every refusal names.
	host string
	// listed: allowedImageURLPrefixes is set (it may be empty).
	listed   bool
	prefixes []provider.ImageURLPrefix
}

// policyError is a refusal. It is permanent: the same URL is refused again.
type policyError struct{ msg string }

func (e *policyError) Error() string { return e.msg }

// setting names allowedImageURLPrefixes in the provider's block.
func (f *urlPolicy) setting() string { return f.block + ".allowedImageURLPrefixes" }

func (f *urlPolicy) refuse(format string, args ...any) error {
	return provider.Permanent(&policyError{msg: fmt.Sprintf("placement.image URL host %s refused: ", f.host) + fmt.Sprintf(format, args...)})
}

// policyFor is the policy of img, or nil for a catalogue image.
func (c *Cache) policyFor(img Image) *urlPolicy {
	if !img.fromSpec {
		return nil
	}
	f := &urlPolicy{block: c.typ, host: urlHost(img.URL), listed: c.cfg.AllowedImageURLPrefixes != nil}
	for _, s := range c.cfg.ImageURLPrefixes() {
		// Validation has parsed every entry already; one that fails here matches nothing.
		if pre, err := provider.ParseImageURLPrefix(s); err == nil {
			f.prefixes = append(f.prefixes, pre)
		}
	}
	return f
}

// admit checks a URL the fetch is about to request, the first or a redirect's target,
// before any connection: a host that is an address literal as the dialer would, then the
// prefixes when they are set. The dialer checks the addresses names resolve to.
func (f *urlPolicy) admit(u *url.URL, redirect bool) error {
	subject := "the URL"
	if redirect {
		subject = "the redirect to host " + u.Host
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		if what := RefusedAddr(a, f.listed); what != "" {
			return f.refuse("%s goes to %s, %s, %s", subject, u.Hostname(), what, f.because(what))
		}
	}
	if f.listed {
		if len(f.prefixes) == 0 {
			return f.refuse("%s is empty, so placement.image must name a key of %s.images", f.setting(), f.block)
		}
		for _, pre := range f.prefixes {
			if pre.Matches(u) {
				return nil
			}
		}
		return f.refuse("%s is under no prefix of %s", subject, f.setting())
	}
	return nil
}

// checkAddr checks the address a connection to host is about to go to.
func (f *urlPolicy) checkAddr(host string, a netip.Addr) error {
	what := RefusedAddr(a, f.listed)
	if what == "" {
		return nil
	}
	subject := "host " + host + " resolves to"
	if host == a.String() {
		subject = "the connection goes to"
	}
	return f.refuse("%s %s, %s, %s", subject, a, what, f.because(what))
}

// because says what would admit an address described as what: the prefix list, except
// for the metadata address, which nothing admits.
func (f *urlPolicy) because(what string) string {
	if what == metadataWhat {
		return "which is never fetched, whatever " + f.setting() + " allows"
	}
	return "which a placement.image URL may not reach unless " + f.setting() + " allows it"
}

// metadataAddrs are the cloud metadata servers, the same list the proxies' egress fence
// refuses (proxyconfig.MetadataAddrs), so that the two never disagree.
var metadataAddrs = func() []netip.Addr {
	out := make([]netip.Addr, len(proxyconfig.MetadataAddrs))
	for i, s := range proxyconfig.MetadataAddrs {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}()

const metadataWhat = "the cloud metadata address"

// RefusedAddr says what a is when a checked fetch may not connect to it, or "". With
// onlyMetadata (the prefix list is set) only the metadata addresses are refused.
func RefusedAddr(a netip.Addr, onlyMetadata bool) string {
	a = a.Unmap().WithZone("")
	for _, m := range metadataAddrs {
		if a == m {
			return metadataWhat
		}
	}
	switch {
	case onlyMetadata:
		return ""
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsUnspecified():
		return "an unspecified address"
	}
	return ""
}

type policyKey struct{}

func withPolicy(ctx context.Context, f *urlPolicy) context.Context {
	if f == nil {
		return ctx
	}
	return context.WithValue(ctx, policyKey{}, f)
}

func policyFrom(ctx context.Context) *urlPolicy {
	f, _ := ctx.Value(policyKey{}).(*urlPolicy)
	return f
}

// Resolver is what the checked dialer asks for a name's addresses; *net.Resolver in
// production.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// PolicyDialer is the image client's DialContext. An unchecked request dials as
// http.DefaultTransport does. A checked one resolves the name itself, checks each address
// and dials only addresses that passed, by address, so what was checked is what is
// connected to.
type PolicyDialer struct {
	Resolver Resolver
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error)
}

func newPolicyDialer() *PolicyDialer {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} // as http.DefaultTransport
	return &PolicyDialer{Resolver: net.DefaultResolver, Dial: d.DialContext}
}

// DialContext connects a request of the image client, checked or not.
func (d *PolicyDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	f := policyFrom(ctx)
	if f == nil {
		return d.Dial(ctx, network, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	addrs, err := d.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var refused, failed error
	for _, a := range addrs {
		if err := f.checkAddr(host, a); err != nil {
			refused = err
			continue
		}
		conn, err := d.Dial(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return conn, nil
		}
		failed = err
	}
	// An address that passed but did not answer may answer next time; a refusal is final.
	if failed != nil {
		return nil, failed
	}
	if refused != nil {
		return nil, refused
	}
	return nil, fmt.Errorf("resolving host %s: no addresses", host)
}

func (d *PolicyDialer) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := d.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolving host %s: %w", host, err)
	}
	return addrs, nil
}

// policyProxy is the image client's proxy choice: the environment's (HTTPS_PROXY and the
// rest), except for a checked request without a prefix list, whose address check needs the
// operator's own connection to go to the image server itself.
func policyProxy(req *http.Request) (*url.URL, error) {
	if f := policyFrom(req.Context()); f != nil && !f.listed {
		return nil, nil
	}
	return http.ProxyFromEnvironment(req)
}

// maxRedirects is net/http's own limit.
const maxRedirects = 10

// policyRedirect is the image client's CheckRedirect: a checked request's redirect target
// goes through admit as the first URL did.
func policyRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if f := policyFrom(req.Context()); f != nil {
		return f.admit(req.URL, true)
	}
	return nil
}

// IsPolicyError reports whether err is a refusal of the policy.
func IsPolicyError(err error) bool {
	var fe *policyError
	return errors.As(err, &fe)
}
