package discovery

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func newNamespace(t testing.TB, ctx context.Context) string {
	t.Helper()
	return shared.Env(t).Namespace(t, ctx, "disc")
}

// cacheSource starts a manager whose cache watches ns (or what opts sets) and returns a
// source over it.
func cacheSource(t testing.TB, ctx context.Context, ns string, opts ...func(*ctrl.Options)) *CacheSource {
	t.Helper()
	var opt func(*ctrl.Options)
	if len(opts) > 0 {
		opt = opts[0]
	}
	mgr := shared.Env(t).NewManager(t, ns, opt)
	src, err := NewCacheSource(ctx, mgr.GetCache())
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, ctx, mgr)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return src
}

type proxySpec struct {
	name, ip, zone string
	phase          v1alpha1.ProxyPhase
	healthy        bool
	labels         map[string]string
}

// createProxies creates the Proxies with the status the reconciler and health engine
// would have written, a few at a time.
func createProxies(t testing.TB, ctx context.Context, ns string, specs []proxySpec) {
	t.Helper()
	c := shared.Client(t)
	var wg sync.WaitGroup
	errs := make(chan error, len(specs))
	sem := make(chan struct{}, 16)
	for _, s := range specs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name, Labels: s.labels},
				Spec: v1alpha1.ProxySpec{Provider: "kvm2-home", Placement: v1alpha1.ProxyPlacement{Region: "home", Zone: s.zone}}}
			if err := c.Create(ctx, px); err != nil {
				errs <- fmt.Errorf("creating proxy %s: %w", s.name, err)
				return
			}
			px.Status = v1alpha1.ProxyStatus{Phase: s.phase, IP: s.ip, Healthy: s.healthy}
			if err := c.Status().Update(ctx, px); err != nil {
				errs <- fmt.Errorf("status of proxy %s: %w", s.name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestCacheSource(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	createProxies(t, ctx, ns, []proxySpec{
		{name: "a", ip: "192.0.2.1", zone: "z1", phase: v1alpha1.PhaseReady, healthy: true, labels: map[string]string{"tier": "gold"}},
		{name: "b", ip: "192.0.2.2", zone: "z1", phase: v1alpha1.PhaseRunning},
		{name: "c", phase: v1alpha1.PhaseProvisioning},
		// healthy but being replaced: not handed out
		{name: "d", ip: "192.0.2.4", zone: "z2", phase: v1alpha1.PhaseProvisioning, healthy: true},
	})
	h := newTestServer(t, cacheSource(t, ctx, ns), Options{}).Handler()
	list := func(q string) string {
		_, body := get(t, h, "/v1/proxies"+q)
		return names(decodeList(t, body))
	}
	testutil.WaitFor(t, waitLong, "the cache to show the four proxies", listed(list, "?healthy=any", ns+"/a,"+ns+"/b,"+ns+"/d"))
	if got := list(""); got != ns+"/a" {
		t.Errorf("healthy: %q, want only a", got)
	}
	_, body := get(t, h, "/v1/proxies?labelSelector=tier=gold")
	if l := decodeList(t, body); len(l.Proxies) != 1 || l.Proxies[0].URL != "http://192.0.2.1:3128" || l.Proxies[0].Zone != "z1" || l.Proxies[0].Provider != "kvm2-home" {
		t.Errorf("entry: %+v", l.Proxies)
	}

	// Requests are answered from memory: no API call per request.
	before := apiCalls.Load()
	for i := 0; i < 200; i++ {
		get(t, h, fmt.Sprintf("/v1/proxies/pick?key=%d", i))
		get(t, h, "/v1/proxies?zone=z1&healthy=any")
	}
	if n := apiCalls.Load() - before; n != 0 {
		t.Errorf("400 requests made %d API calls", n)
	}

	// A status write that changes nothing the API shows, then one that does.
	a := &v1alpha1.Proxy{}
	if err := shared.Client(t).Get(ctx, keyOf(ns, "a"), a); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	a.Status.LastProbeTime, a.Status.ProbeLatencyMilliseconds = &now, 17
	if err := shared.Client(t).Status().Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	a.Status.EgressIP = "198.51.100.77"
	if err := shared.Client(t).Status().Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "the egress IP change to show", func() (bool, error) {
		_, body := get(t, h, "/v1/proxies")
		return strings.Contains(body, "198.51.100.77"), fmt.Errorf("/v1/proxies: %s", body)
	})

	// Changes reach the API without a restart: b becomes healthy, a goes away.
	b := &v1alpha1.Proxy{}
	if err := shared.Client(t).Get(ctx, keyOf(ns, "b"), b); err != nil {
		t.Fatal(err)
	}
	b.Status.Phase, b.Status.Healthy = v1alpha1.PhaseReady, true
	if err := shared.Client(t).Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := shared.Client(t).Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "b to be listed and a to be gone", listed(list, "", ns+"/b"))
	_, text := get(t, h, "/v1/proxies?format=text")
	if !strings.HasPrefix(text, "http://192.0.2.2:3128\n") {
		t.Errorf("text: %q", text)
	}
}

// Only changes the API shows rebuild the snapshot: the health engine's per-round writes
// (lastProbeTime, latency, the condition's message) do not.
func TestSameEntry(t *testing.T) {
	if n := reflect.TypeOf(Entry{}).NumField(); n != 14 {
		t.Fatalf("Entry has %d fields; compare the new ones in Entry.equal and count them here", n)
	}
	base := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "p", Labels: map[string]string{"a": "b"}},
		Spec:   v1alpha1.ProxySpec{Provider: "kvm2-home", Port: 3128, Placement: v1alpha1.ProxyPlacement{Zone: "z"}},
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "192.0.2.1", Healthy: true, EgressIP: "198.51.100.1"}}
	now := metav1.Now()
	for name, tc := range map[string]struct {
		change func(*v1alpha1.Proxy)
		same   bool
	}{
		"lastProbeTime and latency": {func(p *v1alpha1.Proxy) { p.Status.LastProbeTime = &now; p.Status.ProbeLatencyMilliseconds = 9 }, true},
		"failure counter":           {func(p *v1alpha1.Proxy) { p.Status.ConsecutiveProbeFailures = 2 }, true},
		"conditions":                {func(p *v1alpha1.Proxy) { p.Status.Conditions = []metav1.Condition{{Type: "Healthy"}} }, true},
		"healthy":                   {func(p *v1alpha1.Proxy) { p.Status.Healthy = false }, false},
		"phase":                     {func(p *v1alpha1.Proxy) { p.Status.Phase = v1alpha1.PhaseRunning }, false},
		"ip":                        {func(p *v1alpha1.Proxy) { p.Status.IP = "192.0.2.2" }, false},
		"ip cleared":                {func(p *v1alpha1.Proxy) { p.Status.IP = "" }, false},
		"egress":                    {func(p *v1alpha1.Proxy) { p.Status.EgressIP = "" }, false},
		"ipv6":                      {func(p *v1alpha1.Proxy) { p.Status.IPv6 = "2001:db8::1" }, false},
		"label":                     {func(p *v1alpha1.Proxy) { p.Labels["a"] = "c" }, false},
		"port":                      {func(p *v1alpha1.Proxy) { p.Spec.Port = 8080 }, false},
		"zone":                      {func(p *v1alpha1.Proxy) { p.Spec.Placement.Zone = "y" }, false},
		"deleting":                  {func(p *v1alpha1.Proxy) { p.DeletionTimestamp = &now }, false},
		"allowed source ranges": {func(p *v1alpha1.Proxy) {
			p.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}}
		}, true},
		"basic auth": {func(p *v1alpha1.Proxy) { p.Spec.Proxy = &v1alpha1.ProxyConfig{BasicAuth: authRef("auth-a")} }, false},
		"cooldowns": {func(p *v1alpha1.Proxy) {
			p.Status.Cooldowns = []v1alpha1.ProxyCooldown{{Site: "example.com", Until: now, LastOutcome: v1alpha1.CooldownBanned}}
		}, false},
	} {
		changed := base.DeepCopy()
		tc.change(changed)
		if got := sameEntry(base, changed); got != tc.same {
			t.Errorf("%s: sameEntry = %v, want %v", name, got, tc.same)
		}
	}
}

// listed is a WaitFor condition: list(query) answers want.
func listed(list func(string) string, query, want string) func() (bool, error) {
	return func() (bool, error) {
		got := list(query)
		return got == want, fmt.Errorf("listed %q", got)
	}
}

// BenchmarkSameEntry is the informer's test of each Proxy update: the health engine's
// per-round write (lastProbeTime, latency) of a Proxy with labels, basic auth and two
// cooldowns, which leaves its entry the same.
//
//	go test -run '^$' -bench SameEntry -benchmem ./internal/discovery/
func BenchmarkSameEntry(b *testing.B) {
	now := metav1.Now()
	old := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "p", Labels: map[string]string{"a": "b", "tier": "gold"}},
		Spec: v1alpha1.ProxySpec{Provider: "kvm2-home", Port: 3128, Placement: v1alpha1.ProxyPlacement{Zone: "z"},
			Proxy: &v1alpha1.ProxyConfig{BasicAuth: authRef("auth-a")}},
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "192.0.2.1", Healthy: true, EgressIP: "198.51.100.1",
			Cooldowns: []v1alpha1.ProxyCooldown{
				{Site: "example.com", Until: now, LastOutcome: v1alpha1.CooldownBanned},
				{Site: "example.org", Until: now, LastOutcome: v1alpha1.CooldownBanned},
			}}}
	cur := old.DeepCopy()
	cur.Status.LastProbeTime, cur.Status.ProbeLatencyMilliseconds = &now, 12
	b.ReportAllocs()
	for b.Loop() {
		if !sameEntry(old, cur) {
			b.Fatal("a probe write changed the entry")
		}
	}
}

// Every field of Entry counts in equal: changing any one of them, exported or not, makes
// two entries differ, so a field added to Entry and left out of equal (which would keep
// discovery serving the old value) fails here. Equal values held apart (two maps, two
// auth Proxies, two cooldown slices of the same content) compare equal.
func TestEntryEqualSeesEveryField(t *testing.T) {
	typ := reflect.TypeOf(Entry{})
	for i := range typ.NumField() {
		fld := typ.Field(i)
		var base, changed Entry
		field := reflect.ValueOf(&changed).Elem().Field(i)
		// Unexported fields too: set through their address.
		field = reflect.NewAt(fld.Type, unsafe.Pointer(field.UnsafeAddr())).Elem()
		switch {
		case fld.Type.Kind() == reflect.String:
			field.SetString("x")
		case fld.Type.Kind() == reflect.Bool:
			field.SetBool(true)
		case fld.Type == reflect.TypeOf(map[string]string(nil)):
			field.Set(reflect.ValueOf(map[string]string{"a": "b"}))
		case fld.Type == reflect.TypeOf((*v1alpha1.Proxy)(nil)):
			field.Set(reflect.ValueOf(&v1alpha1.Proxy{}))
		case fld.Type == reflect.TypeOf([]v1alpha1.ProxyCooldown(nil)):
			field.Set(reflect.ValueOf([]v1alpha1.ProxyCooldown{{Site: "example.com"}}))
		default:
			t.Fatalf("Entry.%s is a %s: teach this test to change it, and compare it in Entry.equal", fld.Name, fld.Type)
		}
		if base.equal(&changed) || changed.equal(&base) {
			t.Errorf("Entry.%s changed and equal still reports the entries the same: compare it in Entry.equal", fld.Name)
		}
	}

	until := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	full := func() Entry {
		return Entry{Name: "p", Namespace: "n", URL: "http://192.0.2.1:3128", Mode: "Managed", Provider: "kvm2-home",
			Region: "eu", Zone: "z", Pool: "pool", Healthy: true, EgressIP: "198.51.100.1", Labels: map[string]string{"a": "b"},
			auth: authOf(&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "p", UID: "u"},
				Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Proxy: &v1alpha1.ProxyConfig{BasicAuth: authRef("auth-a")}}}),
			cooldowns: []v1alpha1.ProxyCooldown{{Site: "example.com", Until: until, Bans: 2, LastOutcome: v1alpha1.CooldownBanned, LastBanned: &until}},
			urlIPv6:   "http://[2001:db8::1]:3128"}
	}
	a, b := full(), full()
	if !a.equal(&b) {
		t.Errorf("two entries built alike differ:\n%+v\n%+v", a, b)
	}
}

// The parts of Entry compared by content: each field authOf keeps of a Proxy, and each
// field of a cooldown.
func TestEntryEqualAuthAndCooldowns(t *testing.T) {
	authed := func(change func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "p", UID: "u"},
			Spec:   v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Proxy: &v1alpha1.ProxyConfig{BasicAuth: authRef("auth-a")}},
			Status: v1alpha1.ProxyStatus{CredentialsSecret: "snap-1"}}
		change(px)
		return authOf(px)
	}
	base := Entry{auth: authed(func(*v1alpha1.Proxy) {})}
	for name, change := range map[string]func(*v1alpha1.Proxy){
		"namespace":          func(p *v1alpha1.Proxy) { p.Namespace = "m" },
		"name":               func(p *v1alpha1.Proxy) { p.Name = "q" },
		"uid":                func(p *v1alpha1.Proxy) { p.UID = "v" },
		"mode":               func(p *v1alpha1.Proxy) { p.Spec.Mode = v1alpha1.ProxyModeExternal },
		"credentials secret": func(p *v1alpha1.Proxy) { p.Status.CredentialsSecret = "snap-2" },
		"basic auth secret":  func(p *v1alpha1.Proxy) { p.Spec.Proxy.BasicAuth = authRef("auth-b") },
		"basic auth removed": func(p *v1alpha1.Proxy) { p.Spec.Proxy = nil },
	} {
		changed := Entry{auth: authed(change)}
		if base.equal(&changed) {
			t.Errorf("auth: a changed %s leaves the entries the same", name)
		}
	}

	if n := reflect.TypeOf(v1alpha1.ProxyCooldown{}).NumField(); n != 5 {
		t.Fatalf("ProxyCooldown has %d fields; compare the new ones in sameCooldown and change them here", n)
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Second))
	cd := v1alpha1.ProxyCooldown{Site: "example.com", Until: t0, Bans: 1, LastOutcome: v1alpha1.CooldownBanned, LastBanned: &t0}
	same := cd
	same.Until = metav1.NewTime(t0.In(time.FixedZone("elsewhere", 3600))) // the same instant
	if !sameCooldown(cd, same) {
		t.Error("the same instant in another zone makes two cooldowns differ")
	}
	for name, change := range map[string]func(*v1alpha1.ProxyCooldown){
		"site":            func(c *v1alpha1.ProxyCooldown) { c.Site = "example.org" },
		"until":           func(c *v1alpha1.ProxyCooldown) { c.Until = t1 },
		"bans":            func(c *v1alpha1.ProxyCooldown) { c.Bans = 2 },
		"last outcome":    func(c *v1alpha1.ProxyCooldown) { c.LastOutcome = v1alpha1.CooldownOutcome("other") },
		"last banned":     func(c *v1alpha1.ProxyCooldown) { c.LastBanned = &t1 },
		"last banned nil": func(c *v1alpha1.ProxyCooldown) { c.LastBanned = nil },
	} {
		changed := cd
		change(&changed)
		if sameCooldown(cd, changed) {
			t.Errorf("cooldown: a changed %s leaves it the same", name)
		}
	}
}
