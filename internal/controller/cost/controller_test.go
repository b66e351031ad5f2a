package cost

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// providersConfig is the providers config of the tests: gce and hcloud on their default
// tables, kvm2 without prices, and kvm2 with prices of its own.
const providersConfig = `
providers:
- name: gce-us
  type: gce
  gce:
    project: my-proxies
    zones: [us-central1-a]
    machineTypes: {small: e2-small, big: c3-standard-4}
    images: {ubuntu: projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64}
- name: hcloud-eu
  type: hcloud
  hcloud: {tokenFile: /t, locations: [fsn1], serverTypes: [cx22], images: [ubuntu-24.04]}
- name: kvm2-home
  type: kvm2
  kvm2: {sshKeyFile: /k, insecureIgnoreHostKey: true, machineTypes: {small: {vcpus: 1, memoryMiB: 1024}},
         hosts: [{name: beelink, address: 'beelink:22', user: u, bridge: br0}]}
- name: kvm2-priced
  type: kvm2
  kvm2: {sshKeyFile: /k, insecureIgnoreHostKey: true, machineTypes: {small: {vcpus: 1, memoryMiB: 1024}},
         hosts: [{name: beelink, address: 'beelink:22', user: u, bridge: br0}]}
  prices: {currency: CZK, machineTypes: {small: "0.4"}}
`

// syncEnv is the cost reconciler alone on a namespace of its own, with no manager: each
// test runs the reconciles itself (controllertest.ExpectReconciled).
type syncEnv struct {
	T   *testing.T
	Ctx context.Context
	C   client.Client
	NS  string
	R   *CostReconciler
	Rec *events.FakeRecorder
}

func newSyncEnv(t *testing.T) *syncEnv {
	t.Helper()
	env := shared.Env(t)
	ctx := testenv.Context(t)
	cfg, err := provider.ParseConfig([]byte(providersConfig))
	if err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(10)
	return &syncEnv{T: t, Ctx: ctx, C: env.Client, NS: env.Namespace(t, ctx, "cost"),
		R: &CostReconciler{Client: env.Client, Recorder: rec, Providers: Entries(cfg)}, Rec: rec}
}

// proxy creates a Managed Proxy on provider with placement.machineType machineType.
func (e *syncEnv) proxy(name, provider, machineType string, opts ...testbuild.Option) *v1alpha1.Proxy {
	e.T.Helper()
	opts = append([]testbuild.Option{testbuild.Managed(), testbuild.WithProvider(provider),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{MachineType: machineType})}, opts...)
	px := testbuild.Proxy(e.NS, name, opts...)
	if err := e.C.Create(e.Ctx, px); err != nil {
		e.T.Fatalf("creating proxy %s: %v", name, err)
	}
	return px
}

// child creates a Proxy as pool's child, on provider with machineType.
func (e *syncEnv) child(p *v1alpha1.ProxyPool, name, provider, machineType string) *v1alpha1.Proxy {
	e.T.Helper()
	return e.proxy(name, provider, machineType, testbuild.WithLabel(v1alpha1.PoolLabel, p.Name),
		testbuild.WithOwners(*metav1.NewControllerRef(p, v1alpha1.GroupVersion.WithKind("ProxyPool"))))
}

// instance gives px an instance (status.providerID, phase Running), or takes it away
// with id "" (phase Pending), as the Proxy reconciler does.
func (e *syncEnv) instance(px *v1alpha1.Proxy, id string) {
	e.T.Helper()
	st := &v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, ProviderID: id}
	if id == "" {
		st.Phase = v1alpha1.PhasePending
	}
	if err := statusapply.Status(e.Ctx, e.C, px, st, statusapply.ProxyController); err != nil {
		e.T.Fatalf("setting the instance of %s: %v", px.Name, err)
	}
}

func (e *syncEnv) reconcileProxy(px *v1alpha1.Proxy) {
	e.T.Helper()
	controllertest.ExpectReconciled(e.T, e.Ctx, e.C, reconcile.Func(e.R.ReconcileProxy), px)
}

func (e *syncEnv) reconcilePool(p *v1alpha1.ProxyPool) {
	e.T.Helper()
	controllertest.ExpectReconciled(e.T, e.Ctx, e.C, reconcile.Func(e.R.ReconcilePool), p)
}

// pool creates a pool of replicas on provider with machineType.
func (e *syncEnv) pool(name string, replicas int32, provider, machineType string, opts ...testbuild.Option) *v1alpha1.ProxyPool {
	e.T.Helper()
	opts = append([]testbuild.Option{testbuild.WithProvider(provider),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Zone: "z", MachineType: machineType, Image: "ubuntu"})}, opts...)
	p := testbuild.Pool(e.NS, name, replicas, opts...)
	if err := e.C.Create(e.Ctx, p); err != nil {
		e.T.Fatalf("creating pool %s: %v", name, err)
	}
	return p
}

// wantCost fails unless c is want (a decimal as status shows it, written out in full; ""
// for none) in currency.
func wantCost(t *testing.T, what string, c *v1alpha1.Cost, want, currency string) {
	t.Helper()
	switch {
	case want == "" && c != nil:
		t.Errorf("%s: status.cost %s %s, want none", what, c.Hourly, c.Currency)
	case want == "":
	case c == nil:
		t.Errorf("%s: no status.cost, want %s %s", what, want, currency)
	case string(c.Hourly) != want || c.Currency != currency:
		t.Errorf("%s: status.cost %s %s, want %s %s", what, c.Hourly, c.Currency, want, currency)
	}
}

// series are g's series of namespace ns: "<name> <currency>" -> value.
func series(t *testing.T, g *prometheus.GaugeVec, ns string) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1000)
	g.Collect(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		l := map[string]string{}
		for _, p := range d.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["namespace"] == ns {
			out[l["proxy"]+l["pool"]+" "+l["currency"]] = d.GetGauge().GetValue()
		}
	}
	return out
}

func wantSeries(t *testing.T, what string, got map[string]float64, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s series: %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g < v-1e-12 || g > v+1e-12 {
			t.Errorf("%s series: %v, want %v", what, got, want)
			return
		}
	}
}

// TestProxyCost: a gce Proxy with an instance costs its machine type (e2-small, by the
// gce.machineTypes entry placement.machineType names) plus its external IPv4 by gce's
// default table, in status.cost and the gauge; an hcloud one by hcloud's table; a kvm2
// Proxy without prices, an External one, one of a machine type the table lacks and one
// without an instance cost nothing shown; the cost goes with the instance and the series
// with the Proxy.
func TestProxyCost(t *testing.T) {
	e := newSyncEnv(t)
	g := e.proxy("gce", "gce-us", "small")
	e.reconcileProxy(g)
	wantCost(t, "gce proxy without an instance", g.Status.Cost, "", "")

	e.instance(g, "gce://my-proxies/us-central1-a/gce")
	e.reconcileProxy(g)
	wantCost(t, "gce proxy", g.Status.Cost, "0.021751", "USD") // e2-small 0.016751 + IPv4 0.005
	if faults := testenv.StatusOwnership(g, statusapply.ProxyController, statusapply.Cost); len(faults) > 0 {
		t.Errorf("status ownership of %s: %v", g.Name, faults)
	}
	if m := testenv.StatusManagers(g); !strings.Contains(m[statusapply.Cost], `"f:cost"`) {
		t.Errorf("status managers of %s: %v, want %s owning status.cost", g.Name, m, statusapply.Cost)
	}

	h := e.proxy("hcloud", "hcloud-eu", "cx22")
	e.instance(h, "hcloud://1")
	e.reconcileProxy(h)
	wantCost(t, "hcloud proxy", h.Status.Cost, "0.0068", "EUR") // cx22 0.006 + primary IPv4 0.0008

	k := e.proxy("kvm", "kvm2-home", "small")
	e.instance(k, "kvm2://beelink/kvm")
	e.reconcileProxy(k)
	wantCost(t, "kvm2 proxy without prices", k.Status.Cost, "", "")

	kp := e.proxy("kvm-priced", "kvm2-priced", "small")
	e.instance(kp, "kvm2://beelink/kvm-priced")
	e.reconcileProxy(kp)
	wantCost(t, "kvm2 proxy with prices", kp.Status.Cost, "0.4", "CZK") // no address price for kvm2

	big := e.proxy("big", "gce-us", "big")
	e.instance(big, "gce://my-proxies/us-central1-a/big")
	e.reconcileProxy(big)
	wantCost(t, "gce proxy of a type the table lacks", big.Status.Cost, "", "")

	ext := testbuild.Proxy(e.NS, "ext", testbuild.External("192.0.2.7"))
	if err := e.C.Create(e.Ctx, ext); err != nil {
		t.Fatal(err)
	}
	e.reconcileProxy(ext)
	wantCost(t, "External proxy", ext.Status.Cost, "", "")

	wantSeries(t, "proxy", series(t, proxyCostHourly, e.NS), map[string]float64{
		"gce USD": 0.021751, "hcloud EUR": 0.0068, "kvm-priced CZK": 0.4})

	// The instance goes: so does the cost, and the series.
	e.instance(g, "")
	e.reconcileProxy(g)
	wantCost(t, "gce proxy whose instance is gone", g.Status.Cost, "", "")
	// The Proxy goes: so does its series.
	if err := e.C.Delete(e.Ctx, h); err != nil {
		t.Fatal(err)
	}
	e.reconcileProxy(h)
	wantSeries(t, "proxy", series(t, proxyCostHourly, e.NS), map[string]float64{"kvm-priced CZK": 0.4})
}

// TestPoolCost: a pool's status.cost is the sum of its children with an instance and not
// being deleted (a child without an instance adds 0), in their currency, also in the
// gauge; the pool reconciler's writes leave the field to egress-proxies-cost. A pool
// without children costs 0 in its provider's currency; a child with an instance and no
// price leaves the pool without a cost, as do children in two currencies, which a
// Warning event names once.
func TestPoolCost(t *testing.T) {
	e := newSyncEnv(t)
	pr := &pool.ProxyPoolReconciler{Client: e.C, Scheme: e.C.Scheme(), Recorder: &events.FakeRecorder{},
		Zones: map[string][]string{"gce-us": nil, "hcloud-eu": nil, "kvm2-home": nil}, Clock: clocktesting.NewFakeClock(time.Now())}

	p := e.pool("gce", 3, "gce-us", "small")
	controllertest.ExpectReconciled(t, e.Ctx, e.C, pr, p)
	kids := controllertest.ListChildren(t, e.Ctx, e.C, e.NS, p.Name)
	if len(kids) != 3 {
		t.Fatalf("the pool reconciler made %d children, want 3", len(kids))
	}
	e.reconcilePool(p)
	wantCost(t, "pool of children without instances", p.Status.Cost, "0", "USD")

	for i := range kids[:2] {
		e.instance(&kids[i], "gce://my-proxies/z/"+kids[i].Name)
	}
	e.reconcilePool(p)
	wantCost(t, "pool with two instances", p.Status.Cost, "0.043502", "USD")
	wantSeries(t, "pool", series(t, poolCostHourly, e.NS), map[string]float64{"gce USD": 0.043502})

	// The pool reconciler's next pass (on a new generation, so that it writes) applies
	// its status without taking status.cost.
	p.Spec.MinReadySeconds = 5
	if err := e.C.Update(e.Ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.ExpectReconciled(t, e.Ctx, e.C, pr, p)
	if p.Status.ObservedGeneration != p.Generation {
		t.Fatalf("the pool reconciler wrote no status for generation %d", p.Generation)
	}
	if faults := testenv.StatusOwnership(p, statusapply.ProxyPoolController, statusapply.Cost); len(faults) > 0 {
		t.Errorf("status ownership of pool %s: %v", p.Name, faults)
	}
	wantCost(t, "pool after the pool reconciler's pass", p.Status.Cost, "0.043502", "USD")

	// A child being deleted is not counted.
	gone := &kids[0]
	gone.Finalizers = []string{"test.egress.hrajfrisbee.cz/hold"}
	if err := e.C.Update(e.Ctx, gone); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gone.Finalizers = nil
		_ = e.C.Update(context.Background(), gone)
	})
	if err := e.C.Delete(e.Ctx, gone); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool(p)
	wantCost(t, "pool with a child being deleted", p.Status.Cost, "0.021751", "USD")

	// A child of another provider with an instance and no price: the sum is not known.
	e.instance(e.child(p, "kvm-child", "kvm2-home", "small"), "kvm2://beelink/kvm-child")
	e.reconcilePool(p)
	wantCost(t, "pool with an unpriced child", p.Status.Cost, "", "")
	wantSeries(t, "pool", series(t, poolCostHourly, e.NS), nil)

	// Children in two currencies: no sum, and one event, however often the pool is counted.
	m := e.pool("mixed", 0, "gce-us", "small")
	e.instance(e.child(m, "m-gce", "gce-us", "small"), "gce://my-proxies/z/m-gce")
	e.instance(e.child(m, "m-hcloud", "hcloud-eu", "cx22"), "hcloud://2")
	e.reconcilePool(m)
	e.reconcilePool(m)
	wantCost(t, "pool in two currencies", m.Status.Cost, "", "")
	var evs []string
	for len(e.Rec.Events) > 0 {
		evs = append(evs, <-e.Rec.Events)
	}
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+EventCostCurrenciesDiffer+" ") || !strings.Contains(evs[0], "EUR, USD") {
		t.Errorf("events: %q, want one Warning %s naming EUR, USD", evs, EventCostCurrenciesDiffer)
	}

	// Without children: 0 in the template's currency; none for a provider without prices.
	z := e.pool("zero", 0, "hcloud-eu", "cx22")
	e.reconcilePool(z)
	wantCost(t, "hcloud pool at zero", z.Status.Cost, "0", "EUR")
	kz := e.pool("kvm-zero", 0, "kvm2-home", "small")
	e.reconcilePool(kz)
	wantCost(t, "kvm2 pool at zero", kz.Status.Cost, "", "")
	sz := testbuild.Pool(e.NS, "spread-zero", 0, testbuild.WithProvider("gce-us"),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{MachineType: "small"}))
	sz.Spec.Spread = []v1alpha1.PoolSpreadEntry{{Provider: "gce-us", Weight: 1}, {Zone: "us-central1-b", Weight: 1}}
	if err := e.C.Create(e.Ctx, sz); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool(sz)
	wantCost(t, "gce pool spread at zero", sz.Status.Cost, "0", "USD")

	// The pool goes: so does its series.
	if err := e.C.Delete(e.Ctx, z); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool(z)
	wantSeries(t, "pool", series(t, poolCostHourly, e.NS), map[string]float64{"spread-zero USD": 0})
}
