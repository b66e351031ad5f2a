package pool

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// spec.service publishes the children through a selector-less Service the pool owns and
// an EndpointSlice: every child with an address, ready when healthy, in its zone, on the
// proxy port; unsetting spec.service removes both.
func testPoolEndpointSlice(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("pub", 3)
	pool.Spec.Service = &v1alpha1.PoolService{Name: "crawler-proxies"}
	pool.Spec.Spread = []v1alpha1.PoolSpreadEntry{{Zone: "beelink"}, {Zone: "nuc"}, {Zone: "tiny"}}
	pool.Spec.Template.Spec.Port = 8888
	e.Create(pool)
	e.WaitSettled("pub", 3)
	pool = e.GetPool("pub")
	kids := e.Children("pub")

	svc := &corev1.Service{}
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "crawler-proxies"}, svc); err != nil {
		t.Fatalf("the pool's service: %v", err)
	}
	if svc.Spec.Selector != nil || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8888 || svc.Spec.Ports[0].Name != "proxy" {
		t.Errorf("service spec %+v, want no selector and port proxy 8888", svc.Spec)
	}
	if ref := metav1.GetControllerOf(svc); ref == nil || ref.UID != pool.UID {
		t.Errorf("service controller %+v, want the pool", ref)
	}

	e.setUnhealthy(kids[0].Name)
	es := e.waitSlice("crawler-proxies-8888", "two ready, one not", func(eps map[string]bool) bool {
		return len(eps) == 3 && !eps[kids[0].Name] && eps[kids[1].Name] && eps[kids[2].Name]
	})
	if es.Labels[discoveryv1.LabelServiceName] != "crawler-proxies" || es.Labels[discoveryv1.LabelManagedBy] != EndpointSliceManagedBy ||
		es.AddressType != discoveryv1.AddressTypeIPv4 {
		t.Errorf("slice labels %v, address type %s", es.Labels, es.AddressType)
	}
	if len(es.Ports) != 1 || *es.Ports[0].Port != 8888 || *es.Ports[0].Name != "proxy" || *es.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("slice ports %+v, want proxy 8888/TCP", es.Ports)
	}
	byName := map[string]v1alpha1.Proxy{}
	for _, k := range e.Children("pub") {
		byName[k.Name] = k
	}
	for _, ep := range es.Endpoints {
		px := byName[ep.TargetRef.Name]
		if len(ep.Addresses) != 1 || ep.Addresses[0] != px.Status.IP || net.ParseIP(ep.Addresses[0]) == nil {
			t.Errorf("endpoint %s addresses %v, want [%s]", px.Name, ep.Addresses, px.Status.IP)
		}
		if ep.Zone == nil || *ep.Zone != px.Spec.Placement.Zone {
			t.Errorf("endpoint %s zone %v, want %s", px.Name, ep.Zone, px.Spec.Placement.Zone)
		}
		if ep.TargetRef.Kind != "Proxy" || ep.TargetRef.UID != px.UID {
			t.Errorf("endpoint %s target %+v", px.Name, ep.TargetRef)
		}
		if *ep.Conditions.Serving != *ep.Conditions.Ready || *ep.Conditions.Terminating {
			t.Errorf("endpoint %s conditions %+v", px.Name, ep.Conditions)
		}
	}

	// A Service the pool did not make is never taken over.
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: e.NS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}}
	if err := e.C.Create(e.Ctx, foreign); err != nil {
		t.Fatal(err)
	}
	e.Update("pub", func(p *v1alpha1.ProxyPool) { p.Spec.Service.Name = "web" })
	e.WaitPool("pub", "the old service and its slice gone", func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return apierrors.IsNotFound(e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "crawler-proxies"}, &corev1.Service{})) &&
			apierrors.IsNotFound(e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "crawler-proxies-8888"}, &discoveryv1.EndpointSlice{}))
	})
	controllertest.Consistently(t, "the foreign service untouched", func() (bool, error) {
		got := &corev1.Service{}
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(foreign), got); err != nil {
			return false, err
		}
		return len(got.OwnerReferences) == 0 && got.Spec.Selector["app"] == "web" && got.Spec.Ports[0].Port == 80,
			fmt.Errorf("service %+v", got)
	})

	e.Update("pub", func(p *v1alpha1.ProxyPool) { p.Spec.Service = nil })
	waitFor(t, waitLong, "service and slice removed", func() (bool, error) {
		errSvc := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "crawler-proxies"}, &corev1.Service{})
		errES := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "crawler-proxies-8888"}, &discoveryv1.EndpointSlice{})
		return client.IgnoreNotFound(errSvc) == nil && errSvc != nil && client.IgnoreNotFound(errES) == nil && errES != nil,
			nil
	})
}

// markRunning gives every child of pool without an address one (10.x.y.z by its
// position) and phase Ready, as the Proxy reconciler and the health engine would, 16 at
// a time.
func (e *syncEnv) markRunning(pool string) {
	e.T.Helper()
	kids := e.Children(pool)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	errs := make([]error, len(kids))
	for i := range kids {
		px := &kids[i]
		if px.Status.IP != "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			base := px.DeepCopy()
			px.Status.Phase, px.Status.Healthy, px.Status.ProbeLatencyMilliseconds = v1alpha1.PhaseReady, true, 1
			px.Status.IP = fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, i%256)
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
				Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded,
				Message: "probe succeeded", LastTransitionTime: metav1.NewTime(e.Clock.Now()),
			})
			errs[i] = e.C.Status().Patch(e.Ctx, px, client.MergeFrom(base))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		e.T.Fatalf("marking children of %s running: %v", pool, err)
	}
}

// poolSlices are the pool's EndpointSlices by name, and how often each child appears
// in them.
func (e *syncEnv) poolSlices(pool string) (map[string]*discoveryv1.EndpointSlice, map[string]int) {
	e.T.Helper()
	list := &discoveryv1.EndpointSliceList{}
	if err := e.C.List(e.Ctx, list, client.InNamespace(e.NS), client.MatchingLabels{v1alpha1.PoolLabel: pool}); err != nil {
		e.T.Fatal(err)
	}
	byName, seen := map[string]*discoveryv1.EndpointSlice{}, map[string]int{}
	for i := range list.Items {
		es := &list.Items[i]
		byName[es.Name] = es
		for _, ep := range es.Endpoints {
			seen[ep.TargetRef.Name]++
		}
	}
	return byName, seen
}

// published fails the test unless the pool has n children, each in exactly one of its
// EndpointSlices, and slices slices of at most maxEndpointsPerSlice endpoints.
func (e *syncEnv) published(pool string, n, slices int) {
	e.T.Helper()
	byName, seen := e.poolSlices(pool)
	kids := e.Children(pool)
	if len(kids) != n {
		e.T.Fatalf("%d children, want %d", len(kids), n)
	}
	for _, k := range kids {
		if seen[k.Name] != 1 {
			e.T.Errorf("child %s in %d slices (%d slices)", k.Name, seen[k.Name], len(byName))
		}
	}
	if len(seen) != n {
		e.T.Errorf("%d endpoints for %d children", len(seen), n)
	}
	for name, es := range byName {
		if len(es.Endpoints) > maxEndpointsPerSlice {
			e.T.Errorf("slice %s has %d endpoints", name, len(es.Endpoints))
		}
	}
	if len(byName) != slices {
		e.T.Errorf("%d slices, want %d", len(byName), slices)
	}
}

// A pool of 1,001 children publishes 11 slices of at most 100 endpoints, every child
// exactly once; scaled down to 150 it keeps 2 and deletes the rest. It runs on the
// synchronous layer: each step is one reconcile the test runs, with nothing to wait for.
func testPoolSliceShards(t *testing.T, env *testenv.Env) {
	start := time.Now()
	e := newSyncEnv(t, env)
	pool := e.NewPool("big", 1001)
	pool.Spec.Service = &v1alpha1.PoolService{Name: "big"}
	e.Create(pool) // creates the 1,001 children
	if n := len(e.Children("big")); n != 1001 {
		t.Fatalf("%d children after the first pass, want 1,001", n)
	}
	made := time.Since(start)
	e.markRunning("big")
	e.Reconcile(pool)
	e.published("big", 1001, 11)
	full := time.Since(start)
	byName, _ := e.poolSlices("big")
	if _, ok := byName["big-3128"]; !ok {
		t.Errorf("no slice big-3128 among %d", len(byName))
	}
	scalePool(t, e.Ctx, e.C, pool, 150)
	e.Reconcile(pool) // deletes 851 children, published as terminating
	e.Reconcile(pool) // publishes the 150 left
	e.published("big", 150, 2)
	t.Logf("1,001 children made in %v, published in 11 slices after %v; scaled to 150 in 2 slices after %v",
		made.Round(time.Millisecond), full.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
