package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/autoscaler"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/cost"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// setupPools adds the ProxyPool reconciler, which checks pool placements against cfg and
// reports its children's remediation brake under pol, with target's word on the probe
// target (nil: never known to be down).
func setupPools(mgr ctrl.Manager, cfg *provider.Config, pol remediation.Policy, target common.ProbeTargetWatch) error {
	r := &pool.ProxyPoolReconciler{
		Client:      mgr.GetClient(),
		Scheme:      mgr.GetScheme(),
		Recorder:    mgr.GetEventRecorder("proxypool-controller"),
		Zones:       poolZones(cfg),
		Remediation: pol,
		ProbeTarget: target,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("proxy pool reconciler: %w", err)
	}
	return nil
}

// setupAutoscaler adds the built-in autoscaler (internal/controller/autoscaler) unless
// --autoscaler=false, reading the demand Leases in demandNamespace, its budget cap priced
// by cfg's prices (childCost).
func setupAutoscaler(mgr ctrl.Manager, on bool, demandNamespace string, cfg *provider.Config) error {
	if !on {
		return nil
	}
	r := &autoscaler.Reconciler{Client: mgr.GetClient(), DemandNamespace: demandNamespace, CostPerChild: childCost(cost.Entries(cfg))}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("autoscaler: %w", err)
	}
	return nil
}

// childCost is what one child of a pool costs per hour by the providers' prices
// (cost.ChildRate), for spec.budget: unknown (no cap) without a price.
func childCost(providers map[string]provider.ProviderConfig) autoscaler.CostFunc {
	return func(_ context.Context, pool *v1alpha1.ProxyPool) (float64, bool) {
		c, ok := cost.ChildRate(providers, pool)
		if !ok {
			return 0, false
		}
		q := c.Hourly.Quantity()
		return q.AsApproximateFloat64(), true
	}
}

// poolZones lists each configured provider with the zones a pool may name for it: the
// host names of a kvm2 or kvm block, the locations of an hcloud block. A type without
// such a list accepts any zone.
func poolZones(cfg *provider.Config) map[string][]string {
	out := make(map[string][]string, len(cfg.Providers))
	for _, pc := range cfg.Providers {
		var zones []string
		for _, block := range []*provider.KVMConfig{pc.KVM2, pc.KVM} {
			if block == nil {
				continue
			}
			for _, h := range block.Hosts {
				zones = append(zones, h.Name)
			}
		}
		if pc.HCloud != nil {
			zones = append(zones, pc.HCloud.Locations...)
		}
		out[pc.Name] = zones
	}
	return out
}

// poolCacheByObject limits the manager's cache of Services and EndpointSlices, which the
// pool reconciler watches, to those labelled with a pool: a cluster's own are many and
// none of the operator's business.
func poolCacheByObject() map[client.Object]cache.ByObject {
	req, err := labels.NewRequirement(v1alpha1.PoolLabel, selection.Exists, nil)
	if err != nil { // a constant, valid label key
		panic(err)
	}
	sel := labels.NewSelector().Add(*req)
	return map[client.Object]cache.ByObject{
		&corev1.Service{}:            {Label: sel},
		&discoveryv1.EndpointSlice{}: {Label: sel},
	}
}
