package common

// Discovery's picks are demand too: every replica writes, per pool it answered picks for,
// a demand Lease (internal/demand, coordination.k8s.io) in the pool's namespace, by
// server-side apply.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;patch
