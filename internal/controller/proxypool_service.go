package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

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

// publish keeps the pool's selector-less Service and its EndpointSlices (one per proxy
// port in use) in line with the children, or removes them when spec.service is unset.
func (r *ProxyPoolReconciler) publish(ctx context.Context, s *poolScope) error {
	pool := s.pool
	want := ""
	if pool.Spec.Service != nil {
		want = pool.Spec.Service.Name
	}
	if err := r.pruneServices(ctx, pool, want); err != nil {
		return err
	}
	slices := map[string]*discoveryv1.EndpointSlice{}
	if want != "" {
		if err := r.ensureService(ctx, pool, want); err != nil {
			// Publish nothing rather than slices of a Service that is not the pool's.
			return errors.Join(err, r.syncSlices(ctx, pool, nil))
		}
		for _, es := range desiredSlices(pool, want, s.children) {
			slices[es.Name] = es
		}
	}
	return r.syncSlices(ctx, pool, slices)
}

// ensureService creates or updates the Service name, owned by the pool.
func (r *ProxyPoolReconciler) ensureService(ctx context.Context, pool *v1alpha1.ProxyPool, name string) error {
	port := pool.Spec.Template.Spec.Port
	if port == 0 {
		port = 3128
	}
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

// desiredSlices are the IPv4 EndpointSlices of service: every child with an address, one
// slice per proxy port, ready and serving when the child is healthy, not cordoned and not
// being deleted, terminating while it is deleted, in the child's zone.
func desiredSlices(pool *v1alpha1.ProxyPool, service string, children []*v1alpha1.Proxy) []*discoveryv1.EndpointSlice {
	byPort := map[int32][]discoveryv1.Endpoint{}
	for _, px := range children {
		ip := net.ParseIP(px.Status.IP)
		if ip == nil || ip.To4() == nil {
			continue
		}
		port := px.Spec.Port
		if port == 0 {
			port = 3128
		}
		deleting := !px.DeletionTimestamp.IsZero()
		healthy := px.Status.Healthy && px.Status.Phase == v1alpha1.PhaseReady && !deleting &&
			px.Annotations[v1alpha1.CordonAnnotation] != "true"
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
		byPort[port] = append(byPort[port], ep)
	}
	var out []*discoveryv1.EndpointSlice
	for port, eps := range byPort {
		slices.SortFunc(eps, func(a, b discoveryv1.Endpoint) int {
			if a.TargetRef.Name < b.TargetRef.Name {
				return -1
			}
			if a.TargetRef.Name > b.TargetRef.Name {
				return 1
			}
			return 0
		})
		out = append(out, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:      service + "-" + strconv.Itoa(int(port)),
				Namespace: pool.Namespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: service,
					discoveryv1.LabelManagedBy:   EndpointSliceManagedBy,
					v1alpha1.PoolLabel:           pool.Name,
				},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports: []discoveryv1.EndpointPort{{
				Name: ptr.To(servicePortName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port),
			}},
		})
	}
	return out
}

// syncSlices makes the pool's EndpointSlices exactly want (by name).
func (r *ProxyPoolReconciler) syncSlices(ctx context.Context, pool *v1alpha1.ProxyPool, want map[string]*discoveryv1.EndpointSlice) error {
	list := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return fmt.Errorf("listing endpoint slices of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	have := map[string]*discoveryv1.EndpointSlice{}
	for i := range list.Items {
		es := &list.Items[i]
		if !metav1.IsControlledBy(es, pool) {
			continue
		}
		if _, ok := want[es.Name]; !ok {
			if err := r.Client.Delete(ctx, es); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting endpoint slice %s/%s: %w", es.Namespace, es.Name, err)
			}
			continue
		}
		have[es.Name] = es
	}
	for name, es := range want {
		if err := controllerutil.SetControllerReference(pool, es, r.Scheme); err != nil {
			return fmt.Errorf("owner reference on endpoint slice %s: %w", name, err)
		}
		cur, ok := have[name]
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
