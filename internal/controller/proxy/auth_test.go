package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// authProxy is a Managed Proxy of e with spec.proxy naming the Secret secretName and a
// user cloud-init of its own.
func (e *proxyEnv) authProxy(name, secretName string) *v1alpha1.Proxy {
	return authProxyIn(e.ns, name, secretName)
}

// authProxyIn is authProxy in namespace ns.
func authProxyIn(ns, name, secretName string) *v1alpha1.Proxy {
	px := testProxy(ns, name)
	px.Spec.Port = 3128
	px.Spec.CloudInit = "#cloud-config\n# user-part-marker-5be1\ntimezone: UTC\n"
	px.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: v1alpha1.SecretName(secretName)}},
	}
	return px
}

// putSecret creates or updates the Secret name of e's namespace with data, opted in
// (v1alpha1.CredentialsLabel).
func (e *proxyEnv) putSecret(name string, data map[string]string) {
	e.t.Helper()
	e.writeSecret(name, data, map[string]string{v1alpha1.CredentialsLabel: "true"})
}

// writeSecret creates or updates the Secret name of e's namespace with data and labels.
func (e *proxyEnv) writeSecret(name string, data, labels map[string]string) {
	e.t.Helper()
	writeSecretIn(e.t, e.ctx, e.c, e.ns, name, data, labels)
}

// writeSecretIn creates or updates the Secret ns/name through c with data and labels.
func writeSecretIn(t testing.TB, ctx context.Context, c client.Client, ns, name string, data, labels map[string]string) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	err := c.Get(ctx, client.ObjectKeyFromObject(sec), sec)
	sec.Labels = labels
	sec.Data = map[string][]byte{}
	for k, v := range data {
		sec.Data[k] = []byte(v)
	}
	switch {
	case err == nil:
		err = c.Update(ctx, sec)
	default:
		err = c.Create(ctx, sec)
	}
	if err != nil {
		t.Fatalf("writing secret %s/%s: %v", ns, name, err)
	}
}

// creates returns the Create requests the fake provider saw, in order.
func (e *proxyEnv) creates() []provider.CreateRequest {
	var out []provider.CreateRequest
	for _, c := range e.fake.CallsOf(providertest.OpCreate) {
		out = append(out, c.Arg.(provider.CreateRequest))
	}
	return out
}

// expectedRender is what the reconciler should hand the provider for px with creds.
func expectedRender(t *testing.T, px *v1alpha1.Proxy, creds *proxyconfig.Credentials) proxyconfig.Rendered {
	t.Helper()
	r, err := proxyconfig.ForProxy(context.Background(), px, func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
		return creds, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A Proxy with spec.proxy and basic auth through its Secret's life: it waits, with the
// reason in status and a Warning event, while the Secret is missing, incomplete or holds
// values tinyproxy cannot take, without a busy retry (the Secret watch wakes it); the
// provider gets the rendered user-data; a rotated password and a changed range list
// replace the instance; a Secret deleted under a running instance leaves it be. At V(2)
// nothing of the password or the rendered configuration reaches the logs, Events,
// status or spans.
func TestProxyBasicAuthSecretLifecycle(t *testing.T) {
	logs := &controllertest.LogLines{}
	spans := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	e := newProxyEnv(t, withLogLines(logs)) // up to V(2), as the kvm2 never-logged test
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the manager's log:\n%s", logs.String())
		}
	})
	const (
		name     = "auth"
		secret   = "crawl-auth"
		badValue = "Bad-Value with-space-3e7"
		pw1      = "Pw1-first.secret_a81"
		pw2      = "Pw2-rotated.secret_c44"
	)
	e.create(e.authProxy(name, secret))

	// 1. No Secret: Pending, the Secret named, a Warning event, no Create, no requeue.
	wantMissing := "secret " + e.ns + "/" + secret + " (spec.proxy.basicAuth.secretRef) does not exist"
	got := e.waitProxy(name, "waiting for the missing Secret", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhasePending && provisioned(p).Reason == v1alpha1.ReasonCredentialsUnavailable &&
			strings.Contains(p.Status.Message, wantMissing)
	})
	if c := provisioned(got); c.Status != metav1.ConditionFalse || c.Message != got.Status.Message {
		t.Errorf("Provisioned %+v, want False with the message", c)
	}
	e.waitEvent(name, v1alpha1.ReasonCredentialsUnavailable, wantMissing)
	if res, err := e.reconcileNow(name); err != nil || res != (ctrl.Result{}) {
		t.Errorf("a reconcile waiting for the Secret: %+v %v, want no requeue and no error", res, err)
	}
	if n := e.fake.CountOf(providertest.OpCreate); n != 0 {
		t.Fatalf("%d Creates without credentials", n)
	}

	// 2. The Secret appears without a password: the watch wakes the Proxy.
	e.putSecret(secret, map[string]string{"username": "crawler"})
	e.waitProxy(name, "naming the missing key", func(p *v1alpha1.Proxy) bool {
		return strings.Contains(p.Status.Message, `secret `+e.ns+`/`+secret+` (spec.proxy.basicAuth.secretRef) has no key "password"`)
	})
	e.waitEvent(name, v1alpha1.ReasonCredentialsUnavailable, `has no key "password"`)

	// 3. A password tinyproxy cannot take: refused with the allowed characters.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": badValue})
	e.waitProxy(name, "refusing the password's characters", func(p *v1alpha1.Proxy) bool {
		return strings.Contains(p.Status.Message, "password holds a character other than letters A-Z and a-z, digits, '-', '.' and '_'")
	})

	// 4. A good password: the provider gets the rendered user-data.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": pw1})
	got = e.waitPhase(name, v1alpha1.PhaseRunning)
	want := expectedRender(t, got, &proxyconfig.Credentials{Username: "crawler", Password: pw1})
	cs := e.creates()
	if len(cs) != 1 || string(cs[0].CloudInit) != string(want.UserData) {
		t.Fatalf("creates %d, want one with the rendered user-data", len(cs))
	}
	for _, s := range []string{"BasicAuth crawler " + pw1, "Allow 10.0.0.0/8", "user-part-marker-5be1", "multipart/mixed"} {
		if !strings.Contains(string(cs[0].CloudInit), s) {
			t.Errorf("the user-data lacks %q", s)
		}
	}
	if diff := cmp.Diff([]string{"10.0.0.0/8"}, cs[0].SourceRanges); diff != "" {
		t.Errorf("the Create's source ranges (-want +got):\n%s", diff)
	}
	hash1, rendered1 := intentHash(t, got, "crawler", pw1), RenderedHash(got, want.HashInput)
	if got.Status.SpecHash != hash1 || got.Status.RenderedHash != rendered1 || cs[0].SpecHash != rendered1 || rendered1 == RenderedHash(got, got.Spec.CloudInit) {
		t.Errorf("specHash %q renderedHash %q (request %q), want %q and %q, which covers the rendered configuration",
			got.Status.SpecHash, got.Status.RenderedHash, cs[0].SpecHash, hash1, rendered1)
	}
	if c := provisioned(got); c.Status != metav1.ConditionTrue {
		t.Errorf("Provisioned %+v after the Secret was fixed", c)
	}
	id1 := got.Status.ProviderID

	// 5. A rotated password replaces the instance.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": pw2})
	got = e.waitProxy(name, "replaced after the rotation", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.SpecHash != hash1 && p.Status.ProviderID != ""
	})
	want = expectedRender(t, got, &proxyconfig.Credentials{Username: "crawler", Password: pw2})
	if h := intentHash(t, got, "crawler", pw2); got.Status.SpecHash != h || got.Status.RenderedHash != RenderedHash(got, want.HashInput) {
		t.Errorf("specHash %q renderedHash %q after the rotation, want %q and %q", got.Status.SpecHash, got.Status.RenderedHash, h, RenderedHash(got, want.HashInput))
	}
	if cs = e.creates(); string(cs[len(cs)-1].CloudInit) != string(want.UserData) {
		t.Errorf("the last Create does not carry the rotated password")
	}
	if !slices.Contains(e.ops(), providertest.OpDelete+" "+id1) {
		t.Errorf("ops %v: the old instance %s was not deleted", e.ops(), id1)
	}
	hash2 := got.Status.SpecHash

	// 6. A changed range list replaces it too.
	e.edit(name, "spec.proxy.allowedSourceRanges", func(px *v1alpha1.Proxy) {
		px.Spec.Proxy.AllowedSourceRanges = []v1alpha1.CIDR{"10.0.0.0/8", "192.168.0.0/16"}
	})
	got = e.waitProxy(name, "replaced after the range change", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.SpecHash != hash2 && p.Status.ProviderID != ""
	})
	want = expectedRender(t, got, &proxyconfig.Credentials{Username: "crawler", Password: pw2})
	if cs = e.creates(); string(cs[len(cs)-1].CloudInit) != string(want.UserData) || !strings.Contains(string(want.UserData), "Allow 192.168.0.0/16") {
		t.Errorf("the last Create lacks the new range")
	}
	if diff := cmp.Diff([]string{"10.0.0.0/8", "192.168.0.0/16"}, cs[len(cs)-1].SourceRanges); diff != "" {
		t.Errorf("the last Create's source ranges (-want +got):\n%s", diff)
	}
	if h := intentHash(t, got, "crawler", pw2); got.Status.SpecHash != h || got.Status.RenderedHash != RenderedHash(got, want.HashInput) {
		t.Errorf("specHash %q renderedHash %q after the range change, want %q and %q", got.Status.SpecHash, got.Status.RenderedHash, h, RenderedHash(got, want.HashInput))
	}

	// 7. The Secret deleted under a running instance: status says so, the instance stays.
	deletes := e.fake.CountOf(providertest.OpDelete)
	if err := e.c.Delete(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: secret}}); err != nil {
		t.Fatal(err)
	}
	got = e.waitProxy(name, "showing the deleted Secret", func(p *v1alpha1.Proxy) bool {
		return provisioned(p).Reason == v1alpha1.ReasonCredentialsUnavailable && strings.Contains(p.Status.Message, "keeps the configuration it was built with")
	})
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.ProviderID == "" || e.fake.CountOf(providertest.OpDelete) != deletes {
		t.Errorf("phase %s providerID %q deletes %d→%d: the instance must be left as it is", got.Status.Phase, got.Status.ProviderID, deletes, e.fake.CountOf(providertest.OpDelete))
	}

	// 8. The same credentials back: the instance matches again, nothing is replaced.
	creates := e.fake.CountOf(providertest.OpCreate)
	e.putSecret(secret, map[string]string{"username": "crawler", "password": pw2})
	got = e.waitProxy(name, "provisioned again", func(p *v1alpha1.Proxy) bool {
		return provisioned(p).Status == metav1.ConditionTrue
	})
	if e.fake.CountOf(providertest.OpCreate) != creates || e.fake.CountOf(providertest.OpDelete) != deletes {
		t.Errorf("the unchanged credentials replaced the instance")
	}

	// Nothing of the credentials or the rendered configuration surfaced.
	haystacks := strings.Split(logs.String(), "\n")
	if logs.Count("proxy waits for its basic-auth secret") == 0 || logs.Count("proxy phase changed") == 0 {
		t.Fatalf("no log line of the wait or a phase change: the search below would prove nothing:\n%s", logs.String())
	}
	evs, err := e.events(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		haystacks = append(haystacks, ev.Note)
	}
	st, _ := json.Marshal(got.Status)
	haystacks = append(haystacks, string(st))
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			haystacks = append(haystacks, a.Value.String())
		}
		for _, ev := range s.Events() {
			for _, a := range ev.Attributes {
				haystacks = append(haystacks, a.Value.String())
			}
		}
		haystacks = append(haystacks, s.Status().Description)
	}
	for _, secret := range []string{pw1, pw2, badValue, "with-space", "BasicAuth crawler", "DisableViaHeader", "user-part-marker-5be1", "timezone: UTC"} {
		for _, h := range haystacks {
			if strings.Contains(h, secret) {
				t.Errorf("%q leaked into %s", secret, h)
			}
		}
	}
}

// A spec.proxy that cannot be rendered (a spec.cloudInit of no known kind) fails the
// Proxy until its spec changes, without asking the provider.
func TestProxyConfigRenderErrorLatches(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := e.newProxy("bad")
	px.Spec.Port = 3128
	px.Spec.CloudInit = "just some text"
	px.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}}
	e.create(px)
	got := e.waitPhase("bad", v1alpha1.PhaseFailed)
	if c := provisioned(got); c.Reason != v1alpha1.ReasonPermanentError ||
		!strings.Contains(c.Message, "rendering the proxy configuration: spec.cloudInit cannot be combined with spec.proxy: its first line must say what it is") {
		t.Errorf("Provisioned %+v", c)
	}
	if strings.Contains(got.Status.Message, "just some text") {
		t.Errorf("the message quotes the cloud-init: %s", got.Status.Message)
	}
	e.waitEvent("bad", v1alpha1.ReasonPermanentError, "rendering the proxy configuration")
	if n := e.fake.CountOf(providertest.OpCreate); n != 0 {
		t.Errorf("%d Creates of an unrenderable spec", n)
	}

	e.edit("bad", "spec.cloudInit", func(px *v1alpha1.Proxy) { px.Spec.CloudInit = "#!/bin/sh\necho hi\n" })
	e.waitPhase("bad", v1alpha1.PhaseRunning)
	if cs := e.creates(); len(cs) != 1 || !strings.Contains(string(cs[0].CloudInit), "text/x-shellscript") {
		t.Errorf("creates %d, want one with the user's script as a part", len(cs))
	}
}

// A Secret that cannot be read (an API failure, not a missing Secret) is an error the
// controller retries with backoff, not a wait for the user.
func TestProxyCredentialsReadFailureRetries(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) {
		r.Credentials = func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
			return nil, errors.New("reading secret x/y (spec.proxy.basicAuth.secretRef): connection refused")
		}
	}))
	e.create(e.authProxy("flaky", "y"))
	e.waitEvent("flaky", v1alpha1.ReasonTransientError, "connection refused; retrying")
	// The manager's own retries run meanwhile: a direct reconcile that meets one of their
	// writes finds its read stale and asks to run again (RequeueAfter staleRetry, no
	// error), as the controller would; run it again then.
	var err error
	for try := 0; try < 10; try++ {
		var res ctrl.Result
		res, err = e.reconcileNow("flaky")
		if err != nil || res.RequeueAfter != staleRetry {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("reconcile: %v, want the read error back for a retry", err)
	}
	if c := provisioned(e.get("flaky")); c.Reason == v1alpha1.ReasonCredentialsUnavailable {
		t.Errorf("Provisioned %+v: a failed read is not a missing Secret", c)
	}
}

// The Secret watch maps a Secret to the Proxies of its namespace that name it, Managed
// and External.
func TestProxiesForSecret(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	a, b := e.authProxy("uses-a", "a"), e.authProxy("uses-b", "b")
	ext := e.authProxy("external-a", "a")
	ext.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.1", Port: 3128,
		Proxy: &v1alpha1.ProxyConfig{BasicAuth: ext.Spec.Proxy.BasicAuth}}
	plain := e.newProxy("plain")
	for _, px := range []*v1alpha1.Proxy{a, b, ext, plain} {
		e.create(px)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "a"}}
	waitFor(t, waitLong, "the cache to hold the four proxies", func() (bool, error) {
		list := &v1alpha1.ProxyList{}
		err := e.cached.List(e.ctx, list, client.InNamespace(e.ns))
		return len(list.Items) == 4, err
	})
	reqs := e.r.proxiesForSecret(e.ctx, sec)
	var names []string
	for _, r := range reqs {
		if r.Namespace == e.ns {
			names = append(names, r.Name)
		}
	}
	slices.Sort(names)
	if len(reqs) != 2 || !slices.Equal(names, []string{"external-a", "uses-a"}) {
		t.Errorf("requests %v, want %s/external-a and %s/uses-a", reqs, e.ns, e.ns)
	}
}

// A Secret without the opt-in label is not read for any Proxy: a Managed one waits in
// Pending without a Create, an External one is not published (no status.ip, so neither
// probed nor listed), each with CredentialsUnavailable, a message naming the Secret and
// the label, and one Warning event. Labelling the Secret wakes both; removing the label
// from a published External Proxy's Secret takes it back out.
func TestProxyUnlabelledSecretIsNotRead(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	const secret = "deploy-bot"
	e.writeSecret(secret, map[string]string{"username": "bot", "password": "Deploy-Pw.9"}, nil)
	e.create(e.authProxy("managed", secret))
	ext := e.authProxy("external", secret)
	ext.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.1", Port: 3128,
		Proxy: &v1alpha1.ProxyConfig{BasicAuth: ext.Spec.Proxy.BasicAuth}}
	e.create(ext)

	want := "secret " + e.ns + "/" + secret + ` (spec.proxy.basicAuth.secretRef) lacks the label egress.hrajfrisbee.cz/proxy-credentials: "true"`
	wantFix := "kubectl label secret -n " + e.ns + " " + secret + " egress.hrajfrisbee.cz/proxy-credentials=true"
	for _, name := range []string{"managed", "external"} {
		got := e.waitProxy(name, "waiting for the Secret's label", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhasePending && provisioned(p).Reason == v1alpha1.ReasonCredentialsUnavailable &&
				strings.Contains(p.Status.Message, want) && strings.Contains(p.Status.Message, wantFix)
		})
		if c := provisioned(got); c.Status != metav1.ConditionFalse || got.Status.IP != "" {
			t.Errorf("%s: Provisioned %+v, ip %q: want False and no address", name, c, got.Status.IP)
		}
		e.waitEvent(name, v1alpha1.ReasonCredentialsUnavailable, want)
		if _, err := e.reconcileNow(name); err != nil {
			t.Errorf("%s: reconcile: %v", name, err)
		}
		evs, err := e.events(name)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs {
			if ev.Type == corev1.EventTypeWarning && ev.Reason == v1alpha1.ReasonCredentialsUnavailable {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d CredentialsUnavailable Warning events after a second reconcile, want one: %+v", name, n, evs)
		}
	}
	if n := e.fake.CountOf(providertest.OpCreate); n != 0 {
		t.Fatalf("%d Creates with an unlabelled Secret", n)
	}

	// Opted in: both go on without another change.
	e.putSecret(secret, map[string]string{"username": "bot", "password": "Deploy-Pw.9"})
	e.waitPhase("managed", v1alpha1.PhaseRunning)
	got := e.waitPhase("external", v1alpha1.PhaseRunning)
	if got.Status.IP != "192.0.2.1" || provisioned(got).Reason != v1alpha1.ReasonExternal {
		t.Errorf("external after the label: ip %q, Provisioned %+v", got.Status.IP, provisioned(got))
	}

	// The label taken away again: the External Proxy is withdrawn.
	e.writeSecret(secret, map[string]string{"username": "bot", "password": "Deploy-Pw.9"}, nil)
	e.waitProxy("external", "withdrawn when the label goes", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhasePending && p.Status.IP == "" && strings.Contains(p.Status.Message, want)
	})
}

// intentHash is IntentHash of px with these credentials.
func intentHash(t testing.TB, px *v1alpha1.Proxy, user, password string) string {
	t.Helper()
	h, err := IntentHash(px, &proxyconfig.Credentials{Username: user, Password: password}, nil)
	if err != nil {
		t.Fatalf("intent hash: %v", err)
	}
	return h
}
