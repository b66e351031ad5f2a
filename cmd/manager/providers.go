package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud"
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
		// Hetzner Cloud servers; the token file is read on every call.
		provider.TypeHCloud: func(pc provider.ProviderConfig, log logr.Logger) (provider.Provider, error) {
			return hcloud.New(pc, log, hcloud.WithInstallID(installID))
		},
	}
}

// registerProviderMetrics puts the operation metrics provider.Observe records on
// controller-runtime's registry, which the manager serves at /metrics. Once per process:
// the tests start the manager more than once.
var registerProviderMetrics = sync.OnceFunc(func() {
	metrics.Registry.MustRegister(provider.Collectors()...)
})

// defaultProvidersConfig is --providers-config's default, where config/default and the
// chart mount the providers-config ConfigMap.
const defaultProvidersConfig = "/etc/proxy-operator/providers.yaml"

// loadProvidersConfig reads the providers config at path; given tells whether
// --providers-config was on the command line. The manager runs with no providers, and
// none says why, when the flag is given empty, or when it was not given and nothing is at
// its default path: a user with External Proxies alone needs no file. A path that was
// given and does not exist is an error naming it, as is every unreadable or invalid file.
func loadProvidersConfig(path string, given bool) (cfg *provider.Config, none string, err error) {
	if path == "" {
		return &provider.Config{}, "--providers-config is empty", nil
	}
	if !given {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return &provider.Config{}, fmt.Sprintf("--providers-config not given and nothing at its default path %s", path), nil
		}
	}
	if given {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("--providers-config %s: no such file (leave the flag out while nothing is at %s, or give it empty, to run with no providers)", path, defaultProvidersConfig)
		}
	}
	cfg, err = provider.LoadConfig(path)
	if err != nil {
		return nil, "", err
	}
	if len(cfg.Providers) == 0 {
		return cfg, fmt.Sprintf("the providers config %s lists none", path), nil
	}
	return cfg, "", nil
}
