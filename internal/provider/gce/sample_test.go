package gce

import (
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestSampleConfigEntry: the commented gce example of config/samples/providers-config.yaml,
// uncommented, is a valid providers config that builds a gce provider.
func TestSampleConfigEntry(t *testing.T) {
	p, err := New(providertest.SampleEntry(t, "../../..", "gce"), logr.Discard())
	if err != nil || p.cfg.Project != "my-proxies-project" || !p.cfg.Spot {
		t.Fatalf("built %+v, %v", p, err)
	}
}
