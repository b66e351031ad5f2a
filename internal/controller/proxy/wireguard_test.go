package proxy

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// Test WireGuard keys (32 bytes of base64 each), no one's.
const (
	wgTestPrivateKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	wgTestPublicKey  = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
)

// wgConf is a wg-quick configuration for the exit at 198.51.100.<host>.
func wgConf(host int) string {
	return fmt.Sprintf("[Interface]\nPrivateKey = %s\nAddress = 10.64.0.%d/32\n\n[Peer]\nPublicKey = %s\nEndpoint = 198.51.100.%d:51820\nAllowedIPs = 0.0.0.0/0, ::/0\n",
		wgTestPrivateKey, host, wgTestPublicKey, host)
}

// wgProxy is a Managed Proxy of e whose spec.proxy.egress.wireguard.secretRef names secretName.
func (e *proxyEnv) wgProxy(name, secretName string) *v1alpha1.Proxy {
	px := e.newProxy(name)
	px.Spec.Port = 3128
	px.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		Egress: &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{
			SecretRef: &v1alpha1.WireGuardSecretRef{Name: v1alpha1.SecretName(secretName)}}},
	}
	return px
}

// A Proxy with a WireGuard Secret through the Secret's faults: it waits in Pending with
// reason EgressUnavailable, a message naming the Secret, the field and the key or line,
// and a Warning event, and is woken by the Secret watch; a good Secret renders the
// tunnel into the user-data, and an edited one rebuilds the instance. At V(2) the
// private key reaches no log line, Event or status.
func TestProxyWireGuardSecret(t *testing.T) {
	t.Parallel()
	logs := &controllertest.LogLines{}
	e := newProxyEnv(t, withLogLines(logs))
	const name, secret = "wg", "exit-1"
	e.create(e.wgProxy(name, secret))
	field := "secret " + e.ns + "/" + secret + " (spec.proxy.egress.wireguard.secretRef)"
	waitReason := func(what, substr string) {
		t.Helper()
		got := e.waitProxy(name, what, func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhasePending && provisioned(p).Reason == v1alpha1.ReasonEgressUnavailable &&
				strings.Contains(p.Status.Message, substr)
		})
		if c := provisioned(got); c.Status != metav1.ConditionFalse || c.Message != got.Status.Message {
			t.Errorf("%s: Provisioned %+v, want False with the message", what, c)
		}
		e.waitEvent(name, v1alpha1.ReasonEgressUnavailable, substr)
	}

	waitReason("the missing Secret", field+" does not exist")
	e.writeSecret(secret, map[string]string{proxyconfig.SecretKeyWireGuard: wgConf(7)}, nil)
	waitReason("the unlabelled Secret", field+` lacks the label egress.hrajfrisbee.cz/proxy-credentials: "true"`)
	e.putSecret(secret, map[string]string{"wg.conf": wgConf(7)})
	waitReason("the Secret without the key", field+`: wireguard secret unusable: no key "wg0.conf"`)
	e.putSecret(secret, map[string]string{proxyconfig.SecretKeyWireGuard: strings.Replace(wgConf(7), "Endpoint = ", "Endpoint ", 1)})
	waitReason("the malformed configuration", field+`: key "wg0.conf": wireguard secret unusable: line 7: want Key = Value or a [Section]`)
	if n := e.fake.CountOf(providertest.OpCreate); n != 0 {
		t.Fatalf("%d Creates without a usable WireGuard Secret", n)
	}

	e.putSecret(secret, map[string]string{proxyconfig.SecretKeyWireGuard: wgConf(7), proxyconfig.SecretKeyEgressIP: "198.51.100.7"})
	got := e.waitPhase(name, v1alpha1.PhaseRunning)
	cs := e.creates()
	if len(cs) != 1 {
		t.Fatalf("%d Creates, want 1", len(cs))
	}
	for _, s := range []string{proxyconfig.WireGuardScriptPath, "PrivateKey = " + wgTestPrivateKey, "Endpoint = 198.51.100.7:51820", "ip address add 10.64.0.7/32"} {
		if !strings.Contains(string(cs[0].CloudInit), s) {
			t.Errorf("the user-data lacks %q", s)
		}
	}
	hash1 := got.Status.SpecHash

	// An edited Secret (another exit) rebuilds the instance.
	e.putSecret(secret, map[string]string{proxyconfig.SecretKeyWireGuard: wgConf(8)})
	e.waitProxy(name, "rebuilt for the new exit", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.SpecHash != hash1 && p.Status.ProviderID != ""
	})
	if cs = e.creates(); !strings.Contains(string(cs[len(cs)-1].CloudInit), "Endpoint = 198.51.100.8:51820") {
		t.Error("the last Create does not carry the new exit")
	}

	// The never-logged list: the private key is in no log line, Event or status.
	evs, err := e.events(name)
	if err != nil {
		t.Fatal(err)
	}
	haystacks := []string{logs.String()}
	for _, ev := range evs {
		haystacks = append(haystacks, ev.Note)
	}
	st := e.get(name).Status
	haystacks = append(haystacks, st.Message, fmt.Sprint(st.Conditions))
	if logs.String() == "" {
		t.Fatal("no log lines: the search would prove nothing")
	}
	for _, h := range haystacks {
		if strings.Contains(h, wgTestPrivateKey) {
			t.Errorf("the WireGuard private key leaked into %s", h)
		}
	}
}

// The API server refuses a Proxy with both a hand-set and a pool-assigned WireGuard
// configuration, naming both fields.
func TestProxyWireGuardBothRefused(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := e.wgProxy("both", "exit-1")
	px.Spec.Proxy.Egress.WireGuard.AssignedSecretRef = &v1alpha1.WireGuardSecretRef{Name: "exit-2"}
	err := e.c.Create(e.ctx, px)
	want := "spec.proxy.egress.wireguard: secretRef (set by hand) and assignedSecretRef (an assigned configuration) are both set"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create: %v, want a refusal saying %q", err, want)
	}
}
