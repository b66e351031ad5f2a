// Package testbuild builds the API objects tests start from: a Proxy or a ProxyPool with
// the fields a test cares about set by options, so that a test states what differs from
// a plain object and nothing else. An option that sets part of a Proxy's spec sets, on a
// ProxyPool, its template's spec; an option that makes no sense for the object panics,
// naming both.
package testbuild

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Option changes the object being built.
type Option func(client.Object)

// Proxy is a Proxy named ns/name with an empty spec, changed by opts in order.
func Proxy(ns, name string, opts ...Option) *v1alpha1.Proxy {
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, o := range opts {
		o(px)
	}
	return px
}

// Pool is a ProxyPool named ns/name of replicas, its template empty, changed by opts in
// order.
func Pool(ns, name string, replicas int32, opts ...Option) *v1alpha1.ProxyPool {
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxyPoolSpec{Replicas: ptr.To(replicas)}}
	for _, o := range opts {
		o(pool)
	}
	return pool
}

// spec is the Proxy spec obj carries: a Proxy's own, a ProxyPool's template's.
func spec(obj client.Object, what string) *v1alpha1.ProxySpec {
	switch o := obj.(type) {
	case *v1alpha1.Proxy:
		return &o.Spec
	case *v1alpha1.ProxyPool:
		return &o.Spec.Template.Spec
	}
	panic(fmt.Sprintf("testbuild: %s does not apply to a %T", what, obj))
}

// proxy is obj as a Proxy, for the options that set a Proxy's status.
func proxy(obj client.Object, what string) *v1alpha1.Proxy {
	px, ok := obj.(*v1alpha1.Proxy)
	if !ok {
		panic(fmt.Sprintf("testbuild: %s does not apply to a %T", what, obj))
	}
	return px
}

// WithSpec changes the (template's) Proxy spec with change, for what no option says.
func WithSpec(change func(*v1alpha1.ProxySpec)) Option {
	return func(obj client.Object) { change(spec(obj, "WithSpec")) }
}

// WithProvider sets spec.provider.
func WithProvider(provider string) Option {
	return func(obj client.Object) { spec(obj, "WithProvider").Provider = provider }
}

// WithPlacement sets spec.placement.
func WithPlacement(p v1alpha1.ProxyPlacement) Option {
	return func(obj client.Object) { spec(obj, "WithPlacement").Placement = p }
}

// External makes it an External proxy at address (spec.mode, spec.address).
func External(address string) Option {
	return func(obj client.Object) {
		s := spec(obj, "External")
		s.Mode, s.Address = v1alpha1.ProxyModeExternal, address
	}
}

// Managed sets spec.mode Managed (the API server's default).
func Managed() Option {
	return func(obj client.Object) { spec(obj, "Managed").Mode = v1alpha1.ProxyModeManaged }
}

// WithPort sets spec.port.
func WithPort(port int32) Option {
	return func(obj client.Object) { spec(obj, "WithPort").Port = port }
}

// WithBasicAuth sets spec.proxy.basicAuth to the Secret named secret.
func WithBasicAuth(secret string) Option {
	return func(obj client.Object) {
		s := spec(obj, "WithBasicAuth")
		if s.Proxy == nil {
			s.Proxy = &v1alpha1.ProxyConfig{}
		}
		s.Proxy.BasicAuth = &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: v1alpha1.SecretName(secret)}}
	}
}

// WithLabel sets the label key to value (on a ProxyPool, on the pool itself).
func WithLabel(key, value string) Option {
	return func(obj client.Object) { obj.SetLabels(with(obj.GetLabels(), key, value)) }
}

// WithTemplateLabel sets the label key to value on a ProxyPool's template (its
// children's labels).
func WithTemplateLabel(key, value string) Option {
	return func(obj client.Object) {
		pool, ok := obj.(*v1alpha1.ProxyPool)
		if !ok {
			panic(fmt.Sprintf("testbuild: WithTemplateLabel does not apply to a %T", obj))
		}
		l := &pool.Spec.Template.Metadata.Labels
		*l = with(*l, key, value)
	}
}

// WithAnnotation sets the annotation key to value.
func WithAnnotation(key, value string) Option {
	return func(obj client.Object) { obj.SetAnnotations(with(obj.GetAnnotations(), key, value)) }
}

// with is m (made when nil) with key set to value.
func with(m map[string]string, key, value string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[key] = value
	return m
}

// WithUID sets metadata.uid, for objects that never meet an API server.
func WithUID(uid string) Option {
	return func(obj client.Object) { obj.SetUID(types.UID(uid)) }
}

// WithFinalizers sets metadata.finalizers.
func WithFinalizers(f ...string) Option {
	return func(obj client.Object) { obj.SetFinalizers(f) }
}

// WithOwners sets metadata.ownerReferences.
func WithOwners(refs ...metav1.OwnerReference) Option {
	return func(obj client.Object) { obj.SetOwnerReferences(refs) }
}

// WithStatus changes a Proxy's status with change, for what no option says.
func WithStatus(change func(*v1alpha1.ProxyStatus)) Option {
	return func(obj client.Object) { change(&proxy(obj, "WithStatus").Status) }
}

// WithPhase sets a Proxy's status.phase.
func WithPhase(phase v1alpha1.ProxyPhase) Option {
	return func(obj client.Object) { proxy(obj, "WithPhase").Status.Phase = phase }
}

// WithIP sets a Proxy's status.ip.
func WithIP(ip string) Option {
	return func(obj client.Object) { proxy(obj, "WithIP").Status.IP = ip }
}

// Healthy sets a Proxy's status.healthy.
func Healthy() Option {
	return func(obj client.Object) { proxy(obj, "Healthy").Status.Healthy = true }
}

// WithCondition adds (or replaces, by type) a condition in a Proxy's status.
func WithCondition(c metav1.Condition) Option {
	return func(obj client.Object) {
		st := &proxy(obj, "WithCondition").Status
		for i := range st.Conditions {
			if st.Conditions[i].Type == c.Type {
				st.Conditions[i] = c
				return
			}
		}
		st.Conditions = append(st.Conditions, c)
	}
}

// Autoscaled gives a ProxyPool spec.autoscaling from minReplicas to maxReplicas, one
// available child per sessions concurrent sessions.
func Autoscaled(minReplicas, maxReplicas, sessions int32) Option {
	return func(obj client.Object) {
		pool, ok := obj.(*v1alpha1.ProxyPool)
		if !ok {
			panic(fmt.Sprintf("testbuild: Autoscaled does not apply to a %T", obj))
		}
		pool.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr.To(minReplicas), MaxReplicas: maxReplicas,
			Target: v1alpha1.PoolAutoscalingTarget{SessionsPerReplica: ptr.To(sessions)}}
	}
}
