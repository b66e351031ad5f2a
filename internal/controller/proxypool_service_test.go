package controller

import (
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// spec.service publishes the children through a selector-less Service the pool owns and
// an EndpointSlice: every child with an address, ready when healthy, in its zone, on the
// proxy port; unsetting spec.service removes both.
func testPoolEndpointSlice(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.newPool("pub", 3)
	pool.Spec.Service = &v1alpha1.PoolService{Name: "crawler-proxies"}
	pool.Spec.Spread = []v1alpha1.PoolSpreadEntry{{Zone: "beelink"}, {Zone: "nuc"}, {Zone: "tiny"}}
	pool.Spec.Template.Spec.Port = 8888
	e.create(pool)
	e.waitSettled("pub", 3)
	pool = e.getPool("pub")
	kids := e.children("pub")

	svc := &corev1.Service{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "crawler-proxies"}, svc); err != nil {
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
	for _, k := range e.children("pub") {
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
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: e.ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}}
	if err := e.c.Create(e.ctx, foreign); err != nil {
		t.Fatal(err)
	}
	e.update("pub", func(p *v1alpha1.ProxyPool) { p.Spec.Service.Name = "web" })
	e.waitPool("pub", "the old service and its slice gone", func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "crawler-proxies"}, &corev1.Service{})) &&
			apierrors.IsNotFound(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "crawler-proxies-8888"}, &discoveryv1.EndpointSlice{}))
	})
	consistently(t, "the foreign service untouched", func() (bool, error) {
		got := &corev1.Service{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(foreign), got); err != nil {
			return false, err
		}
		return len(got.OwnerReferences) == 0 && got.Spec.Selector["app"] == "web" && got.Spec.Ports[0].Port == 80,
			fmt.Errorf("service %+v", got)
	})

	e.update("pub", func(p *v1alpha1.ProxyPool) { p.Spec.Service = nil })
	waitFor(t, waitLong, "service and slice removed", func() (bool, error) {
		errSvc := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "crawler-proxies"}, &corev1.Service{})
		errES := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "crawler-proxies-8888"}, &discoveryv1.EndpointSlice{})
		return client.IgnoreNotFound(errSvc) == nil && errSvc != nil && client.IgnoreNotFound(errES) == nil && errES != nil,
			nil
	})
}
