package provider

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/go-logr/logr"
)

// Constructor builds a provider from its config entry. log is the manager's logger; a
// provider names its own logger (kvm2 uses "kvm2") and adds its own keys.
type Constructor func(pc ProviderConfig, log logr.Logger) (Provider, error)

// Registry maps a provider type to its constructor. The manager fills it in one place;
// nothing registers itself.
type Registry map[string]Constructor

// Build constructs every provider of cfg, keyed by name, each wrapped by Observe. A type
// with no constructor in reg and a constructor's error are errors naming the provider;
// all of them are reported together, and providers built before a failure are closed.
func Build(cfg *Config, reg Registry, log logr.Logger) (map[string]Provider, error) {
	out := map[string]Provider{}
	if cfg == nil {
		return out, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var problems []error
	for i, pc := range cfg.Providers {
		prefix := providerPrefix(i, pc.Name)
		ctor := reg[pc.Type]
		if ctor == nil {
			problems = append(problems, fmt.Errorf("%s: type %q is not available (available: %s)", prefix, pc.Type, reg.types()))
			continue
		}
		p, err := ctor(pc, log)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", prefix, err))
			continue
		}
		if p == nil {
			problems = append(problems, fmt.Errorf("%s: constructor for type %s returned no provider", prefix, pc.Type))
			continue
		}
		out[pc.Name] = Observe(pc.Name, pc.Type, p)
	}
	if len(problems) > 0 {
		for _, p := range out {
			if c, ok := p.(io.Closer); ok {
				problems = append(problems, c.Close())
			}
		}
		return nil, errors.Join(problems...)
	}
	return out, nil
}

func (r Registry) types() string {
	types := make([]string, 0, len(r))
	for t := range r {
		types = append(types, t)
	}
	slices.Sort(types)
	if len(types) == 0 {
		return "none"
	}
	return strings.Join(types, ", ")
}
