package controller

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// proxyConfigLeaf is one field of v1alpha1.ProxyConfig that holds a value rather than
// more fields: its path (as in the API, spec.proxy.egress.wireguard.secretRef.name) and
// the Go field indices that lead to it.
type proxyConfigLeaf struct {
	path  string
	index []int
}

// proxyConfigLeaves walks v1alpha1.ProxyConfig by reflection, so that a field added to
// it is found here without editing the test.
func proxyConfigLeaves(t *testing.T) []proxyConfigLeaf {
	t.Helper()
	var out []proxyConfigLeaf
	var walk func(typ reflect.Type, path string, index []int)
	walk = func(typ reflect.Type, path string, index []int) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				t.Fatalf("field %s.%s has no JSON name: the walk cannot name it", typ.Name(), f.Name)
			}
			p, idx := path+"."+name, append(append([]int{}, index...), i)
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				walk(ft, p, idx)
				continue
			}
			out = append(out, proxyConfigLeaf{path: p, index: idx})
		}
	}
	walk(reflect.TypeOf(v1alpha1.ProxyConfig{}), "spec.proxy", nil)
	return out
}

// set gives the leaf of cfg value number variant (1 or 2; two variants differ, and
// neither is the zero value except a bool's second, false), making the structs on the
// way. It fails the test on a kind it does not know, so a new kind of field is noticed.
func (l proxyConfigLeaf) set(t *testing.T, cfg *v1alpha1.ProxyConfig, variant int) {
	t.Helper()
	v := reflect.ValueOf(cfg).Elem()
	for _, i := range l.index {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(i)
	}
	if err := setVariant(v, variant); err != nil {
		t.Fatalf("%s: %v", l.path, err)
	}
}

func setVariant(v reflect.Value, variant int) error {
	switch v.Kind() {
	case reflect.String:
		if v.Type() == reflect.TypeOf(v1alpha1.CIDR("")) {
			v.SetString(fmt.Sprintf("10.%d.0.0/16", variant))
		} else {
			v.SetString(fmt.Sprintf("value-%d", variant))
		}
	case reflect.Bool:
		v.SetBool(variant == 1)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(variant))
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		if err := setVariant(s.Index(0), variant); err != nil {
			return err
		}
		v.Set(s)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		return setVariant(v.Elem(), variant)
	default:
		return fmt.Errorf("no test values for a field of kind %s: teach setVariant one", v.Kind())
	}
	return nil
}

// secretsIntent is the intent hash of px as the reconciler computes it, with Secrets
// whose contents follow from their names: a different Secret holds different
// credentials, a different WireGuard configuration.
func secretsIntent(t *testing.T, px *v1alpha1.Proxy) string {
	t.Helper()
	var creds *proxyconfig.Credentials
	if p := px.Spec.Proxy; p != nil && p.BasicAuth != nil {
		n := string(p.BasicAuth.SecretRef.Name)
		creds = &proxyconfig.Credentials{Username: "user-" + n, Password: "pw-" + n}
	}
	var wg *proxyconfig.WireGuard
	if n, _ := px.WireGuardRef(); n != "" {
		wg = testWireGuard("key-of-" + n)
	}
	h, err := intentHashWith(px, creds, wg)
	if err != nil {
		t.Fatalf("intent hash: %v", err)
	}
	return h
}

func testWireGuard(privateKey string) *proxyconfig.WireGuard {
	return &proxyconfig.WireGuard{
		PrivateKey: privateKey,
		Addresses:  []netip.Prefix{netip.MustParsePrefix("10.66.0.2/32")},
		Peer: proxyconfig.WireGuardPeer{PublicKey: "peer-public", Endpoint: "198.51.100.1:51820",
			AllowedIPs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}},
	}
}

func intentTestProxy(cfg *v1alpha1.ProxyConfig) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fence", Namespace: "crawl"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Provider: "home", Port: 3128,
			Placement: v1alpha1.ProxyPlacement{Zone: "beelink"}, CloudInit: "#cloud-config\n", Proxy: cfg},
	}
}

// Every field of spec.proxy is part of a Managed Proxy's intent: setting it, or setting
// it to another value, changes the intent hash, so the edit replaces the instance. The
// fields are found by reflection: one added to v1alpha1.ProxyConfig is checked too.
func TestIntentCoversEveryProxyConfigField(t *testing.T) {
	leaves := proxyConfigLeaves(t)
	if len(leaves) < 6 {
		t.Fatalf("found %d fields in spec.proxy, want at least 6: %+v", len(leaves), leaves)
	}
	unset := secretsIntent(t, intentTestProxy(&v1alpha1.ProxyConfig{}))
	for _, l := range leaves {
		t.Run(l.path, func(t *testing.T) {
			one, two := &v1alpha1.ProxyConfig{}, &v1alpha1.ProxyConfig{}
			l.set(t, one, 1)
			l.set(t, two, 2)
			h1, h2 := secretsIntent(t, intentTestProxy(one)), secretsIntent(t, intentTestProxy(two))
			if h1 == unset {
				t.Errorf("setting %s leaves the intent hash %s: editing it would keep the old instance", l.path, h1)
			}
			if h1 == h2 {
				t.Errorf("changing %s leaves the intent hash %s: editing it would keep the old instance", l.path, h1)
			}
		})
	}
}

// A pool's template hash covers every field of the template's spec.proxy, and the
// children it makes carry the field, so their intent differs from the old children's.
func TestPoolTemplateCoversEveryProxyConfigField(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	r := &ProxyPoolReconciler{Scheme: scheme}
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "crawlers", Namespace: "crawl", UID: "pool-uid"}}
	pool.Spec.Template.Spec = intentTestProxy(&v1alpha1.ProxyConfig{}).Spec
	child := func(cfg *v1alpha1.ProxyConfig) (templateHash, intent string) {
		p := pool.DeepCopy()
		p.Spec.Template.Spec.Proxy = cfg
		s := &poolScope{pool: p, now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), hash: TemplateHash(&p.Spec.Template)}
		px, err := r.newChild(s, placement{provider: "home", zone: "beelink"})
		if err != nil {
			t.Fatal(err)
		}
		px.Name = "crawlers-abcde"
		return s.hash, secretsIntent(t, px)
	}
	unsetTemplate, unsetIntent := child(&v1alpha1.ProxyConfig{})
	for _, l := range proxyConfigLeaves(t) {
		t.Run(l.path, func(t *testing.T) {
			one, two := &v1alpha1.ProxyConfig{}, &v1alpha1.ProxyConfig{}
			l.set(t, one, 1)
			l.set(t, two, 2)
			t1, i1 := child(one)
			t2, i2 := child(two)
			if t1 == unsetTemplate || t1 == t2 {
				t.Errorf("template hashes %s (unset), %s, %s: the pool would not roll its children for %s", unsetTemplate, t1, t2, l.path)
			}
			if i1 == unsetIntent || i1 == i2 {
				t.Errorf("children's intent hashes %s (unset), %s, %s: a child would not carry %s", unsetIntent, i1, i2, l.path)
			}
		})
	}
}

// The intent hash of a Proxy that sets only the fields of spec.proxy the hash covered
// before it embedded spec.proxy whole is the one that version recorded, so an upgrade
// replaces none of them. The golden hashes were computed by that version.
func TestIntentHashKeptForUnchangedProxies(t *testing.T) {
	ranges := []v1alpha1.CIDR{"10.0.0.0/8", "2001:db8::/32"}
	auth := &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}}
	wg := func(byHand bool) *v1alpha1.ProxyEgress {
		ref := &v1alpha1.WireGuardSecretRef{Name: "exit-1"}
		if byHand {
			return &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{SecretRef: ref}}
		}
		return &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{AssignedSecretRef: ref}}
	}
	for _, c := range []struct {
		name   string
		cfg    *v1alpha1.ProxyConfig
		mutate func(*v1alpha1.Proxy)
		want   string
	}{
		{"ranges", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges}, nil, "a2225408957b257c"},
		{"basic auth", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges, BasicAuth: auth}, nil, "4270ebc0f743477f"},
		{"wireguard by hand", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges, BasicAuth: auth, Egress: wg(true)}, nil, "dbbf8923bcd80515"},
		{"assigned wireguard, port and placement", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges[:1], Egress: wg(false)}, func(px *v1alpha1.Proxy) {
			px.Spec.Port = 8080
			px.Spec.Placement = v1alpha1.ProxyPlacement{Region: "eu", Zone: "b", MachineType: "small", Image: "debian-12"}
			px.Spec.CloudInit = "#cloud-config\ntimezone: UTC\n"
		}, "a3675f2492275b4a"},
		{"without spec.proxy", nil, nil, "d7b3a8fdab2b2676"},
	} {
		px := intentTestProxy(c.cfg)
		if c.mutate != nil {
			c.mutate(px)
		}
		if got := secretsIntent(t, px); got != c.want {
			t.Errorf("%s: intent hash %s, want %s as before: an upgrade would replace such Proxies' instances", c.name, got, c.want)
		}
	}
}

// A status.specHash an earlier version recorded for a Proxy that sets allowedDestinations
// or allowOpenProxy is recognized (partialIntentHash), though this version's intent
// hash of the same spec differs.
func TestPartialIntentHashIsTheEarlierVersions(t *testing.T) {
	px := intentTestProxy(&v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}},
		AllowedDestinations: []v1alpha1.CIDR{"192.168.1.0/24"}, AllowOpenProxy: true})
	creds := &proxyconfig.Credentials{Username: "user-auth", Password: "pw-auth"}
	const earlier = "e5f008a970205248" // computed by that version
	partial, err := partialIntentHash(px, creds, nil)
	if err != nil || partial != earlier {
		t.Errorf("partial intent hash %s (%v), want %s", partial, err, earlier)
	}
	if now := secretsIntent(t, px); now == earlier {
		t.Errorf("intent hash %s is the earlier version's: it misses allowedDestinations and allowOpenProxy", now)
	}
}
