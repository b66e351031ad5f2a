package controllertest

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// What the tests of the Proxy's intent hash and of the pool's template hash share: every
// field of spec.proxy, found by reflection, and Secrets whose contents follow from names.

// ProxyConfigLeaf is one field of v1alpha1.ProxyConfig that holds a value rather than
// more fields: its path (as in the API, spec.proxy.egress.wireguard.secretRef.name) and
// the Go field indices that lead to it.
type ProxyConfigLeaf struct {
	Path  string
	index []int
}

// ProxyConfigLeaves walks v1alpha1.ProxyConfig by reflection, so that a field added to
// it is found here without editing the test.
func ProxyConfigLeaves(t *testing.T) []ProxyConfigLeaf {
	t.Helper()
	var out []ProxyConfigLeaf
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
			out = append(out, ProxyConfigLeaf{Path: p, index: idx})
		}
	}
	walk(reflect.TypeOf(v1alpha1.ProxyConfig{}), "spec.proxy", nil)
	return out
}

// Set gives the leaf of cfg value number variant (1 or 2; two variants differ, and
// neither is the zero value except a bool's second, false), making the structs on the
// way. It fails the test on a kind it does not know, so a new kind of field is noticed.
func (l ProxyConfigLeaf) Set(t *testing.T, cfg *v1alpha1.ProxyConfig, variant int) {
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
		t.Fatalf("%s: %v", l.Path, err)
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

// SecretsFor is what the Secrets px names hold, as the intent tests see them: contents
// that follow from the Secrets' names, so a different Secret holds different credentials,
// a different WireGuard configuration.
func SecretsFor(px *v1alpha1.Proxy) (*proxyconfig.Credentials, *proxyconfig.WireGuard) {
	var creds *proxyconfig.Credentials
	if p := px.Spec.Proxy; p != nil && p.BasicAuth != nil {
		n := string(p.BasicAuth.SecretRef.Name)
		creds = &proxyconfig.Credentials{Username: "user-" + n, Password: "pw-" + n}
	}
	var wg *proxyconfig.WireGuard
	if n, _ := px.WireGuardRef(); n != "" {
		wg = WireGuardConfig("key-of-" + n)
	}
	return creds, wg
}

// WireGuardConfig is a WireGuard configuration with privateKey.
func WireGuardConfig(privateKey string) *proxyconfig.WireGuard {
	return &proxyconfig.WireGuard{
		PrivateKey: privateKey,
		Addresses:  []netip.Prefix{netip.MustParsePrefix("10.66.0.2/32")},
		Peer: proxyconfig.WireGuardPeer{PublicKey: "peer-public", Endpoint: "198.51.100.1:51820",
			AllowedIPs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}},
	}
}

// IntentTestProxy is a Managed Proxy with spec.proxy cfg, as the intent tests hash it.
func IntentTestProxy(cfg *v1alpha1.ProxyConfig) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fence", Namespace: "crawl"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Provider: "home", Port: 3128,
			Placement: v1alpha1.ProxyPlacement{Zone: "beelink"}, CloudInit: "#cloud-config\n", Proxy: cfg},
	}
}
