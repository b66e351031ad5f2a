package main

import (
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
)

// registry maps each provider type of the providers config to its constructor. This is
// the one place provider types are made available to the manager. installID is the
// install's identity (--install-id), which every provider writes into its marks.
func registry(installID string) provider.Registry {
	return provider.Registry{
		provider.TypeKVM2: func(pc provider.ProviderConfig, log logr.Logger) (provider.Provider, error) {
			return kvm2.New(pc, log, kvm2.WithInstallID(installID))
		},
		// The first-generation type runs on the same code with its own block and
		// metadata namespace, so neither type sees the other's domains.
		provider.TypeKVM: func(pc provider.ProviderConfig, log logr.Logger) (provider.Provider, error) {
			return kvm2.NewOfType(pc, provider.TypeKVM, log, kvm2.WithInstallID(installID))
		},
		// Compute Engine VMs; the API clients are made on first use.
		provider.TypeGCE: func(pc provider.ProviderConfig, log logr.Logger) (provider.Provider, error) {
			return gce.New(pc, log, gce.WithInstallID(installID))
		},
	}
}

// registerProviderMetrics puts the operation metrics provider.Observe records on
// controller-runtime's registry, which the manager serves at /metrics. Once per process:
// the tests start the manager more than once.
var registerProviderMetrics = sync.OnceFunc(func() {
	metrics.Registry.MustRegister(provider.Collectors()...)
})
