package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/cost"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// setupCosts adds the cost controller, which writes each Proxy's and each ProxyPool's
// status.cost from the prices of cfg's entries, and logs the machine types of the
// catalogues that have no price (their Proxies show no cost).
func setupCosts(mgr ctrl.Manager, cfg *provider.Config, log logr.Logger) error {
	r := &cost.CostReconciler{
		Client:    mgr.GetClient(),
		Recorder:  mgr.GetEventRecorder("egress-proxies-cost"),
		Providers: cost.Entries(cfg),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("cost controller: %w", err)
	}
	for _, pc := range cfg.Providers {
		if missing := unpriced(pc); len(missing) > 0 {
			log.Info("no price for some machine types of a provider: their Proxies show no status.cost until its prices block gives one",
				"provider", pc.Name, "machineTypes", strings.Join(missing, ", "))
		}
	}
	return nil
}

// unpriced lists the names placement.machineType may use on pc that have no price, for
// an entry with a price table (gce's and hcloud's defaults, or a prices block).
func unpriced(pc provider.ProviderConfig) []string {
	if _, ok := pc.PriceTable(); !ok {
		return nil
	}
	var names []string
	switch {
	case pc.GCE != nil:
		for name := range pc.GCE.MachineTypes {
			names = append(names, name)
		}
	case pc.HCloud != nil:
		names = pc.HCloud.ServerTypes
	case pc.KVM2 != nil:
		for name := range pc.KVM2.MachineTypes {
			names = append(names, name)
		}
	case pc.KVM != nil:
		for name := range pc.KVM.MachineTypes {
			names = append(names, name)
		}
	}
	var out []string
	for _, name := range names {
		if _, ok := pc.Hourly(name); !ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
