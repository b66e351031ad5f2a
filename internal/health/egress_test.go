package health

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// A wg0.conf the parser takes (the keys are 32 zero and 32 one bytes, base64).
const testWGConf = `[Interface]
PrivateKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
Address = 10.64.0.2/32

[Peer]
PublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=
Endpoint = 192.0.2.1:51820
AllowedIPs = 0.0.0.0/0, ::/0
`

func TestVerifyEgress(t *testing.T) {
	want := netip.MustParseAddr("198.51.100.7")
	failed := result{err: errors.New("refused")}
	for _, tc := range []struct {
		name     string
		r        result
		want     netip.Addr
		reason   string
		verified bool
	}{
		{"the stated address", result{egressIP: "198.51.100.7"}, want, "", true},
		{"the stated address, IPv4-mapped", result{egressIP: "::ffff:198.51.100.7"}, want, "", true},
		{"another address", result{egressIP: "203.0.113.1"}, want, v1alpha1.ReasonEgressMismatch, false},
		{"not an address", result{egressIP: "exit"}, want, v1alpha1.ReasonEgressMismatch, false},
		{"target reports none", result{}, want, "", false},
		{"no address stated", result{egressIP: "203.0.113.1"}, netip.Addr{}, "", false},
		{"failed probe", failed, want, "", false},
	} {
		got := verifyEgress(tc.r, tc.want, "10.0.0.5:3128")
		if got.reason != tc.reason || got.verified != tc.verified || (tc.reason != "") != (got.err != nil && got.err != tc.r.err) {
			t.Errorf("%s: %+v, want reason %q verified %v", tc.name, got, tc.reason, tc.verified)
		}
		if tc.reason != "" && !strings.Contains(got.err.Error(), "probe through 10.0.0.5:3128: the probe target saw the proxy leave from "+tc.r.egressIP+
			", but its WireGuard Secret states egressIP 198.51.100.7") {
			t.Errorf("%s: error %q", tc.name, got.err)
		}
	}
}

// A mismatch takes a healthy proxy out of rotation at once (no threshold), with one
// Warning Event on entering it and none while it lasts; the address the target saw is
// the status's egressIP.
func TestLayResultEgressMismatch(t *testing.T) {
	px := testbuild.Proxy("", "", testbuild.WithPort(3128), testbuild.WithPhase(v1alpha1.PhaseReady), testbuild.WithIP("10.0.0.5"))
	now := time.Now()
	if tr := layResult(px, result{latency: time.Millisecond, egressIP: "198.51.100.7", verified: true}, now, 3, ""); tr == nil || tr.reason != v1alpha1.ReasonProbeSucceeded ||
		!strings.Contains(tr.note, "egress IP 198.51.100.7 (the egressIP its WireGuard Secret states)") {
		t.Fatalf("verified probe: %+v", tr)
	}
	mismatch := verifyEgress(result{latency: time.Millisecond, egressIP: "203.0.113.1"}, netip.MustParseAddr("198.51.100.7"), "10.0.0.5:3128")
	tr := layResult(px, mismatch, now, 3, "")
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if tr == nil || tr.typ != corev1.EventTypeWarning || tr.reason != v1alpha1.ReasonEgressMismatch || px.Status.Healthy ||
		c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonEgressMismatch || px.Status.EgressIP != "203.0.113.1" {
		t.Fatalf("first mismatch: event %+v, status %+v", tr, px.Status)
	}
	if tr := layResult(px, mismatch, now, 3, ""); tr != nil {
		t.Errorf("second mismatch: event %+v, want none while it lasts", tr)
	}
}

// With the egressIP in the Secret the engine checks what the probe target saw: a proxy
// leaving from another address is unhealthy with reason EgressMismatch and a Warning
// Event; once the Secret states the address it leaves from, it is healthy and says it was
// checked; without egressIP in the Secret the address is only reported.
func TestEngineEgressMismatch(t *testing.T) {
	cl := shared.Env(t).Client
	e := newEngineEnv(t, func(o *Options) {
		o.WireGuard = proxyconfig.SecretWireGuard{Reader: cl, Metadata: cl}.WireGuard
	})
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "exit-1", Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{proxyconfig.SecretKeyWireGuard: []byte(testWGConf), proxyconfig.SecretKeyEgressIP: []byte("198.51.100.7")}}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	fp := healthtest.New(t, "127.0.0.3") // the target sees 127.0.0.3
	e.proxyWith("wg", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning, &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"127.0.0.0/8"},
		Egress: &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{SecretRef: &v1alpha1.WireGuardSecretRef{Name: "exit-1"}}}})

	if st := e.round(); st.Probed != 1 || st.Writes != 1 {
		t.Fatalf("first round: %+v", st)
	}
	px := e.get("wg")
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if px.Status.Healthy || c == nil || c.Reason != v1alpha1.ReasonEgressMismatch || px.Status.EgressIP != "127.0.0.3" ||
		!strings.Contains(c.Message, "saw the proxy leave from 127.0.0.3, but its WireGuard Secret states egressIP 198.51.100.7") {
		t.Fatalf("after a probe seen from 127.0.0.3: healthy %v, egressIP %q, condition %+v", px.Status.Healthy, px.Status.EgressIP, c)
	}
	e.waitEvent("wg", v1alpha1.ReasonEgressMismatch, 1)
	if st := e.round(); st.Writes != 0 {
		t.Errorf("the same mismatch again: %d writes, want none", st.Writes)
	}

	sec.Data[proxyconfig.SecretKeyEgressIP] = []byte("127.0.0.3")
	if err := e.c.Update(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.round()
	px = e.get("wg")
	c = meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if !px.Status.Healthy || c.Reason != v1alpha1.ReasonProbeSucceeded || !strings.Contains(c.Message, "egress IP 127.0.0.3 (the egressIP its WireGuard Secret states)") {
		t.Fatalf("with the address it leaves from in the Secret: healthy %v, condition %+v", px.Status.Healthy, c)
	}

	delete(sec.Data, proxyconfig.SecretKeyEgressIP)
	if err := e.c.Update(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.round()
	px = e.get("wg")
	c = meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if !px.Status.Healthy || c.Message != "probe through "+fp.Host+":"+strconv.Itoa(int(fp.Port))+" succeeded, egress IP 127.0.0.3" {
		t.Errorf("without egressIP in the Secret: healthy %v, condition %+v", px.Status.Healthy, c)
	}
}

// A WireGuard Secret that cannot be read fails the probe, naming the Proxy.
func TestProbeFailsWhenTheWireGuardSecretCannotBeRead(t *testing.T) {
	target := whoamiTarget(t, "json")
	fp := healthtest.New(t, "")
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "p1"},
		Spec: v1alpha1.ProxySpec{Port: fp.Port, Proxy: &v1alpha1.ProxyConfig{Egress: &v1alpha1.ProxyEgress{
			WireGuard: &v1alpha1.ProxyWireGuard{SecretRef: &v1alpha1.WireGuardSecretRef{Name: "exit-1"}}}}},
		Status: v1alpha1.ProxyStatus{IP: fp.Host}}
	lookup := func(context.Context, *v1alpha1.Proxy) (*proxyconfig.WireGuard, error) {
		return nil, errors.New(`secret crawl/exit-1 (spec.proxy.egress.wireguard.secretRef) not found`)
	}
	e, err := New(nil, nil, nil, Options{ProbeURL: target.URL, Timeout: 5 * time.Second, WireGuard: lookup}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	r := e.probeOne(context.Background(), px)
	if r.err == nil || !strings.Contains(r.err.Error(), "egress check of the probe of crawl/p1: secret crawl/exit-1 (spec.proxy.egress.wireguard.secretRef) not found") {
		t.Errorf("probe with an unreadable WireGuard Secret: %v", r.err)
	}
}
