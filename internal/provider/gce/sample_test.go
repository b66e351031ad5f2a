package gce

import (
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestSampleConfigEntry: the commented gce example of config/samples/providers-config.yaml,
// uncommented, is a valid providers config that builds a gce provider; its prices
// override the default table (a Spot e2-small with its address at 0.0075 USD an hour).
func TestSampleConfigEntry(t *testing.T) {
	pc := providertest.SampleEntry(t, "../../..", "gce")
	p, err := New(pc, logr.Discard())
	if err != nil || p.cfg.Project != "my-proxies-project" || !p.cfg.Spot {
		t.Fatalf("built %+v, %v", p, err)
	}
	if c, ok := pc.Hourly("small"); !ok || c.Hourly != "0.0075" || c.Currency != "USD" {
		t.Errorf("the sample's small costs %v %v, want 0.0075 USD", c, ok)
	}
}
