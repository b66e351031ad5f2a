package kvm2

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// testNet stands in for DNS and for routing below the policy: names resolve through a map,
// never through real DNS, and a dial to a routed address goes to a local listener instead.
// A routed address is an ordinary, allowed one (TEST-NET-1), so a fetch can start from a
// server the policy lets through, while the servers all listen on 127.0.0.1. The policy
// checks the address before the dial reaches testNet, so the routes cannot hide what it
// checks; every address dialled is recorded.
type testNet struct {
	mu     sync.Mutex
	names  map[string][]netip.Addr
	routes map[string]string // "192.0.2.10:80" -> a listener's address
	dialed []string
}

func (n *testNet) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addrs, ok := n.names[host]; ok {
		return addrs, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (n *testNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	n.dialed = append(n.dialed, addr)
	to, ok := n.routes[addr]
	n.mu.Unlock()
	if !ok {
		to = addr
	}
	var d net.Dialer
	return d.DialContext(ctx, network, to)
}

func (n *testNet) dials() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.dialed...)
}

// mirrorName is a name the tests' resolver maps to a TEST-NET-1 address routed to the
// image server: an image server on an allowed address.
const (
	mirrorName = "mirror.example.test"
	mirrorAddr = "192.0.2.10"
)

// urlPolicyEnv is a testEnv with an image server whose provider fetches over a testNet, with
// the policy setting prefixes (nil: absent).
type urlPolicyEnv struct {
	*testEnv
	net  *testNet
	port string // the image server's port; the mirror's URLs use it too
}

func newURLPolicyEnv(t *testing.T, prefixes *[]string) *urlPolicyEnv {
	t.Helper()
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.p.cfg.AllowedImageURLPrefixes = prefixes
	_, port, err := net.SplitHostPort(e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n := &testNet{
		names: map[string][]netip.Addr{
			mirrorName:              {netip.MustParseAddr(mirrorAddr)},
			"rebind.example.test":   {netip.MustParseAddr("127.0.0.1")},
			"metadata.example.test": {netip.MustParseAddr("169.254.169.254")},
			"ll6.example.test":      {netip.MustParseAddr("fe80::1")},
			"mapped.example.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		},
		routes: map[string]string{net.JoinHostPort(mirrorAddr, port): e.srv.Listener.Addr().String()},
	}
	e.p.images.Dialer.Resolver = n
	e.p.images.Dialer.Dial = n.dial
	return &urlPolicyEnv{testEnv: e, net: n, port: port}
}

// mirrorURL is a URL on the allowed mirror, path and query as given.
func (e *urlPolicyEnv) mirrorURL(pathQuery string) string {
	return "http://" + net.JoinHostPort(mirrorName, e.port) + pathQuery
}

// loopbackURL is a URL on the image server's real, loopback address.
func (e *urlPolicyEnv) loopbackURL(pathQuery string) string { return e.srv.URL + pathQuery }

func (e *urlPolicyEnv) createImage(name, ref string) (provider.Instance, error) {
	req := testRequest(name)
	req.Placement.Zone = e.host
	req.Placement.Image = ref
	return createSettled(context.Background(), e.p, req)
}

// redirector answers every request with a 302 to location and counts them.
func redirector(t *testing.T, location string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, location, http.StatusFound)
	}))
	t.Cleanup(s.Close)
	return s, &hits
}

func TestImageURLPolicyFetchesAnAllowedURLWithoutPrefixes(t *testing.T) {
	e := newURLPolicyEnv(t, nil)
	raw := e.mirrorURL("/images/noble.qcow2")
	if _, err := e.createImage("vm-a", raw); err != nil {
		t.Fatal(err)
	}
	img := must(imagecache.Resolve("kvm2", nil, raw))
	if base, ok := e.volume(img.BaseVol()); !ok || string(base.Content) != string(e.srv.body) {
		t.Fatalf("base %s missing or not the served image", img.BaseVol())
	}
	want := net.JoinHostPort(mirrorAddr, e.port)
	for _, d := range e.net.dials() {
		if d != want {
			t.Fatalf("dialled %s; every connection should go to the checked address %s", d, want)
		}
	}
	if e.srv.gets.Load() != 1 {
		t.Fatalf("%d GETs, want 1", e.srv.gets.Load())
	}
}

// A URL under an allowed prefix is fetched whatever its address: here the image server's
// own loopback one, as a LAN mirror named by an admin would be. A redirect that stays under
// the prefix is followed.
func TestImageURLPolicyPrefixAdmitsAnyAddress(t *testing.T) {
	e := newURLPolicyEnv(t, nil)
	hop, hits := redirector(t, e.loopbackURL("/images/debian.qcow2"))
	e.p.cfg.AllowedImageURLPrefixes = &[]string{e.loopbackURL("/images/"), hop.URL + "/go/"}
	if _, err := e.createImage("vm-a", hop.URL+"/go/debian.qcow2"); err != nil {
		t.Fatal(err)
	}
	if hits.Load() == 0 || e.srv.gets.Load() != 1 {
		t.Fatalf("redirector %d hits, image server %d GETs", hits.Load(), e.srv.gets.Load())
	}
}

// Catalogue URLs are the admin's and are not checked, even with an empty prefix list.
func TestImageURLPolicyLeavesTheCatalogueAlone(t *testing.T) {
	e := newURLPolicyEnv(t, &[]string{})
	if _, err := e.create("vm-a"); err != nil { // debian-13, on 127.0.0.1
		t.Fatal(err)
	}
	e.wantCached(t)
}

func TestImageURLPolicyRefusals(t *testing.T) {
	const setting = "kvm2.allowedImageURLPrefixes"
	for _, tc := range []struct {
		name     string
		prefixes func(e *urlPolicyEnv) *[]string
		ref      func(e *urlPolicyEnv) string
		host     func(e *urlPolicyEnv) string // the host the message names; the URL's when nil
		msg      string
		hop      func(e *urlPolicyEnv) string // when set, ref is a redirector to this location
	}{
		{name: "loopback literal", ref: func(e *urlPolicyEnv) string { return e.loopbackURL("/images/x.qcow2") },
			msg: "the URL goes to 127.0.0.1, a loopback address, which a placement.image URL may not reach unless " + setting + " allows it"},
		{name: "loopback v6 literal", ref: func(e *urlPolicyEnv) string { return "http://[::1]:" + e.port + "/images/x.qcow2" },
			msg: "the URL goes to ::1, a loopback address"},
		{name: "v4-mapped loopback literal", ref: func(e *urlPolicyEnv) string { return "http://[::ffff:127.0.0.1]:" + e.port + "/x" },
			msg: "the URL goes to ::ffff:127.0.0.1, a loopback address"},
		{name: "link-local literal", ref: func(*urlPolicyEnv) string { return "http://169.254.10.20/x.qcow2" },
			msg: "the URL goes to 169.254.10.20, a link-local address"},
		{name: "link-local v6 literal", ref: func(*urlPolicyEnv) string { return "http://[fe80::1]/x.qcow2" },
			msg: "the URL goes to fe80::1, a link-local address"},
		{name: "metadata address", ref: func(*urlPolicyEnv) string { return "http://169.254.169.254/latest/meta-data/" },
			msg: "the URL goes to 169.254.169.254, the cloud metadata address"},
		{name: "metadata v6 address", ref: func(*urlPolicyEnv) string { return "http://[fd00:ec2::254]/latest/meta-data/" },
			msg: "the URL goes to fd00:ec2::254, the cloud metadata address"},
		{name: "unspecified", ref: func(e *urlPolicyEnv) string { return "http://0.0.0.0:" + e.port + "/x" },
			msg: "the URL goes to 0.0.0.0, an unspecified address"},
		{name: "unspecified v6", ref: func(e *urlPolicyEnv) string { return "http://[::]:" + e.port + "/x" },
			msg: "the URL goes to ::, an unspecified address"},
		{name: "name resolving to loopback", ref: func(e *urlPolicyEnv) string { return "http://rebind.example.test:" + e.port + "/x.qcow2" },
			msg: "host rebind.example.test resolves to 127.0.0.1, a loopback address"},
		{name: "name resolving to mapped loopback", ref: func(e *urlPolicyEnv) string { return "http://mapped.example.test:" + e.port + "/x" },
			msg: "host mapped.example.test resolves to ::ffff:127.0.0.1, a loopback address"},
		{name: "name resolving to metadata", ref: func(*urlPolicyEnv) string { return "http://metadata.example.test/latest/meta-data/" },
			msg: "host metadata.example.test resolves to 169.254.169.254, the cloud metadata address, which is never fetched, whatever " + setting + " allows"},
		{name: "name resolving to link-local v6", ref: func(*urlPolicyEnv) string { return "http://ll6.example.test/x" },
			msg: "host ll6.example.test resolves to fe80::1, a link-local address"},
		{name: "redirect to loopback literal", hop: func(e *urlPolicyEnv) string { return e.loopbackURL("/images/x.qcow2") },
			msg: "the redirect to host 127.0.0.1:%PORT% goes to 127.0.0.1, a loopback address"},
		{name: "redirect to metadata", hop: func(*urlPolicyEnv) string { return "http://169.254.169.254/latest/meta-data/" },
			msg: "the redirect to host 169.254.169.254 goes to 169.254.169.254, the cloud metadata address"},
		{name: "redirect to a name resolving to loopback", hop: func(e *urlPolicyEnv) string { return "http://rebind.example.test:" + e.port + "/x" },
			msg: "host rebind.example.test resolves to 127.0.0.1, a loopback address"},
		{name: "prefix mismatch", prefixes: func(e *urlPolicyEnv) *[]string { return &[]string{e.loopbackURL("/other/")} },
			ref: func(e *urlPolicyEnv) string { return e.loopbackURL("/images/x.qcow2") },
			msg: "the URL is under no prefix of " + setting},
		{name: "prefix mismatch by dot segments", prefixes: func(e *urlPolicyEnv) *[]string { return &[]string{e.loopbackURL("/images/")} },
			ref: func(e *urlPolicyEnv) string { return e.loopbackURL("/images/../secret") },
			msg: "the URL is under no prefix of " + setting},
		{name: "empty prefix list", prefixes: func(*urlPolicyEnv) *[]string { return &[]string{} },
			ref: func(e *urlPolicyEnv) string { return e.mirrorURL("/images/x.qcow2") },
			msg: setting + " is empty, so placement.image must name a key of kvm2.images"},
		{name: "redirect out of the prefixes", prefixes: func(e *urlPolicyEnv) *[]string { return &[]string{"http://%HOP%/"} },
			hop: func(e *urlPolicyEnv) string { return e.loopbackURL("/images/x.qcow2") },
			msg: "the redirect to host 127.0.0.1:%PORT% is under no prefix of " + setting},
		{name: "prefix matching the metadata address", prefixes: func(*urlPolicyEnv) *[]string { return &[]string{"http://169.254.169.254/"} },
			ref: func(*urlPolicyEnv) string { return "http://169.254.169.254/latest/meta-data/" },
			msg: "the URL goes to 169.254.169.254, the cloud metadata address, which is never fetched, whatever " + setting + " allows"},
		{name: "prefix matching a name resolving to metadata",
			prefixes: func(*urlPolicyEnv) *[]string { return &[]string{"http://metadata.example.test/"} },
			ref:      func(*urlPolicyEnv) string { return "http://metadata.example.test/latest/meta-data/" },
			msg:      "host metadata.example.test resolves to 169.254.169.254, the cloud metadata address, which is never fetched, whatever " + setting + " allows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newURLPolicyEnv(t, nil)
			ref, hops := "", (*atomic.Int32)(nil)
			var hopHost string
			if tc.hop != nil {
				var hop *httptest.Server
				hop, hops = redirector(t, tc.hop(e))
				hopHost = hop.Listener.Addr().String()
				ref = hop.URL + "/go/x.qcow2"
				if tc.prefixes == nil {
					// Without prefixes the redirector must be on an allowed address: the mirror.
					_, port, _ := net.SplitHostPort(hopHost)
					e.net.routes[net.JoinHostPort(mirrorAddr, port)] = hopHost
					ref = "http://" + net.JoinHostPort(mirrorName, port) + "/go/x.qcow2"
				}
			} else {
				ref = tc.ref(e)
			}
			if tc.prefixes != nil {
				list := *tc.prefixes(e)
				for i := range list {
					list[i] = strings.ReplaceAll(list[i], "%HOP%", hopHost)
				}
				e.p.cfg.AllowedImageURLPrefixes = &list
			}
			_, err := e.createImage("vm-a", ref)
			wantClass(t, err, provider.ErrPermanent, nil)
			want := fmt.Sprintf("placement.image URL host %s refused: ", must(url.Parse(ref)).Host) +
				strings.ReplaceAll(tc.msg, "%PORT%", e.port)
			if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), setting) {
				t.Fatalf("Create:\n got  %q\n want %q..., naming %s", err, want, setting)
			}
			if n := e.srv.gets.Load() + e.srv.heads.Load(); n != 0 {
				t.Fatalf("the image server was asked %d times", n)
			}
			if tc.hop != nil && hops.Load() == 0 {
				t.Fatal("the redirector was never asked: the refusal did not come from the redirect")
			}
			for _, d := range e.net.dials() {
				host, _, _ := net.SplitHostPort(d)
				if a, err := netip.ParseAddr(host); err == nil && imagecache.RefusedAddr(a, false) != "" && tc.prefixes == nil {
					t.Fatalf("a refused address was dialled: %s", d)
				}
				if strings.HasPrefix(d, "169.254.169.254:") {
					t.Fatalf("the metadata address was dialled: %s", d)
				}
			}
			if _, ok := e.volume(overlayVolName("vm-a")); ok {
				t.Fatal("an overlay was created for a refused image")
			}
		})
	}
}

// A base cached for a URL before the policy refused it is not used: the refusal comes
// before the pool is looked at.
func TestImageURLPolicyRefusesACachedURL(t *testing.T) {
	e := newURLPolicyEnv(t, &[]string{})
	raw := e.mirrorURL("/images/x.qcow2")
	e.img = must(imagecache.Resolve("kvm2", nil, raw))
	e.putCached(t, e.srv.digest)
	_, err := e.createImage("vm-a", raw)
	wantClass(t, err, provider.ErrPermanent, nil)
	if !imagecache.IsPolicyError(err) {
		t.Fatalf("Create: %v, want the policy's refusal", err)
	}
	if _, ok := e.volume(overlayVolName("vm-a")); ok {
		t.Fatal("an overlay was created over a refused image")
	}
}

// What a user sees of a URL (status and Events carry the Create error, plus logs, spans
// and progress) never holds its userinfo or query string.
func TestImageURLRedacted(t *testing.T) {
	secrets := []string{"s3cret", "op@", "t0ken", "sig="}
	clean := func(t *testing.T, what, s string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(s, sec) {
				t.Fatalf("%s carries %q: %s", what, sec, s)
			}
		}
	}
	e := newURLPolicyEnv(t, nil)
	raw := "http://op:s3cret@" + net.JoinHostPort(mirrorName, e.port) + "/images/x.qcow2?sig=t0ken"
	shown := e.mirrorURL("/images/x.qcow2")
	check := func(t *testing.T, err error) {
		t.Helper()
		clean(t, "the Create error", err.Error())
		for _, l := range e.logs.all() {
			clean(t, "a log line", l)
		}
		for _, s := range spansFor(e.host) {
			clean(t, "span "+s.Name()+" status", s.Status().Description)
			for _, ev := range s.Events() {
				for _, a := range ev.Attributes {
					clean(t, "span "+s.Name()+" event", a.Value.String())
				}
			}
			for _, a := range s.Attributes() {
				clean(t, "span "+s.Name()+" attribute", a.Value.String())
			}
		}
	}
	for _, mode := range []string{"404", "503", serveChunked, serveShort} {
		t.Run(mode, func(t *testing.T) {
			e.srv.setMode(mode)
			_, err := e.createImage("vm-"+strings.ToLower(mode), raw)
			if err == nil {
				t.Fatal("Create succeeded against a failing mirror")
			}
			if !strings.Contains(err.Error(), shown) {
				t.Fatalf("Create: %q does not name %s", err, shown)
			}
			check(t, err)
		})
	}
	t.Run("fetched", func(t *testing.T) {
		e.srv.setMode(serveOK)
		var reports []string
		req := testRequest("vm-ok")
		req.Placement.Zone, req.Placement.Image = e.host, raw
		// The progress a user sees is the one the pending results carry.
		var err error
		testutil.WaitFor(t, waitLong, "the Create to settle", func() (bool, error) {
			_, err = e.p.Create(context.Background(), req)
			if p, ok := provider.PendingProgress(err); ok {
				reports = append(reports, p.Message)
				return false, fmt.Errorf("pending: %s", p.Message)
			}
			return true, nil
		})
		if err != nil || len(reports) == 0 {
			t.Fatalf("Create: %v after %d pending results", err, len(reports))
		}
		if len(e.logs.find(`"msg":"base image cached"`)) != 1 ||
			len(e.logs.find(`"msg":"fetching base image into host pool"`, `"url":"`+shown+`"`)) == 0 {
			t.Fatalf("no fetching line naming %s, or not one cached line", shown)
		}
		check(t, errors.New(strings.Join(reports, "\n")))
	})
	t.Run("not an http URL", func(t *testing.T) {
		_, err := e.createImage("vm-ftp", "ftp://op:s3cret@"+mirrorName+"/x.qcow2?sig=t0ken")
		wantClass(t, err, provider.ErrPermanent, nil)
		if !strings.Contains(err.Error(), `placement.image "ftp://`+mirrorName+`/x.qcow2" is neither`) {
			t.Fatalf("Create: %v", err)
		}
		check(t, err)
	})
	t.Run("refused", func(t *testing.T) {
		_, err := e.createImage("vm-refused", "http://op:s3cret@169.254.169.254/latest/?sig=t0ken")
		wantClass(t, err, provider.ErrPermanent, nil)
		check(t, err)
	})
}
