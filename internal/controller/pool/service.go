package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// EndpointSliceManagedBy is the endpointslice.kubernetes.io/managed-by value on the
// slices a pool publishes, so that the cluster's EndpointSlice controller leaves them be.
const EndpointSliceManagedBy = "proxypool.egress.hrajfrisbee.cz"

// servicePortName names the Service port and every slice port: kube-proxy matches them
// by name, so children on different proxy ports (mid-rollout) are all reached.
const servicePortName = "proxy"

// publish keeps the pool's selector-less Service and its EndpointSlices (per proxy port
// in use, sharded at maxEndpointsPerSlice) in line with the children, or removes them
// when spec.service is unset.
func (r *ProxyPoolReconciler) publish(ctx context.Context, s *poolScope) error {
	pool := s.pool
	want := ""
	if pool.Spec.Service != nil {
		want = pool.Spec.Service.Name
	}
	if err := r.pruneServices(ctx, pool, want); err != nil {
		return err
	}
	have, err := r.listSlices(ctx, pool)
	if err != nil {
		return err
	}
	slices := map[string]*discoveryv1.EndpointSlice{}
	if want != "" {
		if err := r.ensureService(ctx, pool, want); err != nil {
			// Publish nothing rather than slices of a Service that is not the pool's.
			return errors.Join(err, r.syncSlices(ctx, pool, have, nil))
		}
		for _, es := range desiredSlices(pool, want, s.proxies(), have) {
			slices[es.Name] = es
		}
	}
	return r.syncSlices(ctx, pool, have, slices)
}

// ensureService creates or updates the Service name, owned by the pool.
func (r *ProxyPoolReconciler) ensureService(ctx context.Context, pool *v1alpha1.ProxyPool, name string) error {
	port := pool.Spec.Template.Spec.PortOrDefault()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pool.Namespace}}
	_, err := controllerutil.CreateOrPatch(ctx, r.Client, svc, func() error {
		if svc.ResourceVersion != "" && !metav1.IsControlledBy(svc, pool) {
			return fmt.Errorf("service %s/%s exists and was not made by proxy pool %s: choose another spec.service.name", svc.Namespace, svc.Name, pool.Name)
		}
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		svc.Labels[v1alpha1.PoolLabel] = pool.Name
		svc.Spec.Selector = nil // the pool supplies the endpoints
		svc.Spec.Ports = []corev1.ServicePort{{
			Name: servicePortName, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(port),
		}}
		return controllerutil.SetControllerReference(pool, svc, r.Scheme)
	})
	if err != nil {
		return fmt.Errorf("service %s/%s of proxy pool %s: %w", pool.Namespace, name, pool.Name, err)
	}
	return nil
}

// pruneServices deletes Services the pool owns under another name than want.
func (r *ProxyPoolReconciler) pruneServices(ctx context.Context, pool *v1alpha1.ProxyPool, want string) error {
	list := &corev1.ServiceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return fmt.Errorf("listing services of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	for i := range list.Items {
		svc := &list.Items[i]
		if svc.Name == want || !metav1.IsControlledBy(svc, pool) {
			continue
		}
		if err := r.Client.Delete(ctx, svc); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting service %s/%s of proxy pool %s: %w", svc.Namespace, svc.Name, pool.Name, err)
		}
	}
	return nil
}

// maxEndpointsPerSlice is the most endpoints one slice holds, the EndpointSlice
// controller's default (the API refuses more than 1,000).
const maxEndpointsPerSlice = 100

// sliceName is the name of shard k of the slices of service on port: <service>-<port>,
// then <service>-<port>-1, -2, ...
func sliceName(service string, port int32, k int) string {
	if k == 0 {
		return service + "-" + strconv.Itoa(int(port))
	}
	return service + "-" + strconv.Itoa(int(port)) + "-" + strconv.Itoa(k)
}

// parseSliceName is the port and shard of a slice named by sliceName for service.
func parseSliceName(service, name string) (port int32, k int, ok bool) {
	rest, found := strings.CutPrefix(name, service+"-")
	if !found {
		return 0, 0, false
	}
	ps, ks, sharded := strings.Cut(rest, "-")
	p, err := strconv.ParseInt(ps, 10, 32)
	if err != nil || p <= 0 {
		return 0, 0, false
	}
	if sharded {
		if k, err = strconv.Atoi(ks); err != nil || k <= 0 {
			return 0, 0, false
		}
	}
	return int32(p), k, true
}

// desiredSlices are the IPv4 EndpointSlices of service: every child with an address, on
// the slices of its proxy port, ready and serving when the child is healthy, not
// cordoned and not being deleted, terminating while it is deleted, in the child's zone.
// A child stays on the slice that already holds it (so one child's change rewrites one
// slice); a new one goes to the first slice of its port with room, or a new slice. When
// a port has more slices than its endpoints need (a scale down), the emptiest slices are
// emptied into the others.
func desiredSlices(pool *v1alpha1.ProxyPool, service string, children []*v1alpha1.Proxy, have []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	type key struct {
		port int32
		k    int
	}
	eps := map[string]discoveryv1.Endpoint{} // by child name
	portOf := map[string]int32{}
	var order []string
	for _, px := range children {
		ep, port, ok := endpointOf(px)
		if !ok {
			continue
		}
		if _, dup := eps[px.Name]; dup {
			continue
		}
		eps[px.Name], portOf[px.Name] = ep, port
		order = append(order, px.Name)
	}
	slices.Sort(order)

	shards := map[key][]string{}
	assigned := map[string]bool{}
	for _, es := range have {
		port, k, ok := parseSliceName(service, es.Name)
		if !ok {
			continue
		}
		for _, old := range es.Endpoints {
			if old.TargetRef == nil {
				continue
			}
			n := old.TargetRef.Name
			if p, ok := portOf[n]; !ok || p != port || assigned[n] || len(shards[key{port, k}]) >= maxEndpointsPerSlice {
				continue
			}
			shards[key{port, k}] = append(shards[key{port, k}], n)
			assigned[n] = true
		}
	}
	// shardsOf are the shard numbers of port in use, ascending.
	shardsOf := func(port int32) []int {
		var ks []int
		for sk, names := range shards {
			if sk.port == port && len(names) > 0 {
				ks = append(ks, sk.k)
			}
		}
		slices.Sort(ks)
		return ks
	}
	place := func(port int32, n string) {
		ks := shardsOf(port)
		for _, k := range ks {
			if len(shards[key{port, k}]) < maxEndpointsPerSlice {
				shards[key{port, k}] = append(shards[key{port, k}], n)
				return
			}
		}
		k := 0
		for slices.Contains(ks, k) {
			k++
		}
		shards[key{port, k}] = append(shards[key{port, k}], n)
	}
	for _, n := range order {
		if !assigned[n] {
			place(portOf[n], n)
		}
	}
	// Compact: no more slices per port than its endpoints need.
	total := map[int32]int{}
	for _, n := range order {
		total[portOf[n]]++
	}
	for port, count := range total {
		need := (count + maxEndpointsPerSlice - 1) / maxEndpointsPerSlice
		for {
			ks := shardsOf(port)
			if len(ks) <= need {
				break
			}
			// The emptiest shard (the highest on ties) goes; its endpoints move.
			victim := ks[len(ks)-1]
			for _, k := range ks {
				if len(shards[key{port, k}]) < len(shards[key{port, victim}]) {
					victim = k
				}
			}
			moving := shards[key{port, victim}]
			delete(shards, key{port, victim})
			for _, n := range moving {
				place(port, n)
			}
		}
	}

	var out []*discoveryv1.EndpointSlice
	for sk, names := range shards {
		if len(names) == 0 {
			continue
		}
		slices.Sort(names)
		list := make([]discoveryv1.Endpoint, len(names))
		for i, n := range names {
			list[i] = eps[n]
		}
		out = append(out, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:      sliceName(service, sk.port, sk.k),
				Namespace: pool.Namespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: service,
					discoveryv1.LabelManagedBy:   EndpointSliceManagedBy,
					v1alpha1.PoolLabel:           pool.Name,
				},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   list,
			Ports: []discoveryv1.EndpointPort{{
				Name: ptr.To(servicePortName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(sk.port),
			}},
		})
	}
	return out
}

// endpointOf is px's endpoint and proxy port, when it has an IPv4 address.
func endpointOf(px *v1alpha1.Proxy) (discoveryv1.Endpoint, int32, bool) {
	ip := net.ParseIP(px.Status.IP)
	if ip == nil || ip.To4() == nil {
		return discoveryv1.Endpoint{}, 0, false
	}
	port := px.Port()
	deleting := !px.DeletionTimestamp.IsZero()
	healthy := px.Serving()
	ep := discoveryv1.Endpoint{
		Addresses: []string{ip.String()},
		Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(healthy), Serving: ptr.To(healthy), Terminating: ptr.To(deleting),
		},
		TargetRef: &corev1.ObjectReference{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "Proxy",
			Namespace: px.Namespace, Name: px.Name, UID: px.UID,
		},
	}
	if z := px.Spec.Placement.Zone; z != "" {
		ep.Zone = ptr.To(z)
	}
	return ep, port, true
}

// listSlices are the EndpointSlices the pool controls.
func (r *ProxyPoolReconciler) listSlices(ctx context.Context, pool *v1alpha1.ProxyPool) ([]*discoveryv1.EndpointSlice, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return nil, fmt.Errorf("listing endpoint slices of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	var out []*discoveryv1.EndpointSlice
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], pool) {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// syncSlices makes the pool's EndpointSlices (have) exactly want (by name).
func (r *ProxyPoolReconciler) syncSlices(ctx context.Context, pool *v1alpha1.ProxyPool, have []*discoveryv1.EndpointSlice, want map[string]*discoveryv1.EndpointSlice) error {
	byName := map[string]*discoveryv1.EndpointSlice{}
	for _, es := range have {
		if _, ok := want[es.Name]; !ok {
			if err := r.Client.Delete(ctx, es); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting endpoint slice %s/%s: %w", es.Namespace, es.Name, err)
			}
			continue
		}
		byName[es.Name] = es
	}
	for name, es := range want {
		if err := controllerutil.SetControllerReference(pool, es, r.Scheme); err != nil {
			return fmt.Errorf("owner reference on endpoint slice %s: %w", name, err)
		}
		cur, ok := byName[name]
		if !ok {
			if err := r.Client.Create(ctx, es); err != nil {
				return fmt.Errorf("creating endpoint slice %s/%s: %w", es.Namespace, name, err)
			}
			continue
		}
		if equality.Semantic.DeepEqual(cur.Endpoints, es.Endpoints) && equality.Semantic.DeepEqual(cur.Ports, es.Ports) &&
			equality.Semantic.DeepEqual(cur.Labels, es.Labels) {
			continue
		}
		cur.Endpoints, cur.Ports, cur.Labels = es.Endpoints, es.Ports, es.Labels
		if err := r.Client.Update(ctx, cur); err != nil {
			return fmt.Errorf("updating endpoint slice %s/%s: %w", cur.Namespace, name, err)
		}
	}
	return nil
}
