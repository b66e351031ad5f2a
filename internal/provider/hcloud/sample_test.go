package hcloud

import (
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestSampleConfigEntry: the commented hcloud example of
// config/samples/providers-config.yaml, uncommented, is a valid providers config that
// builds an hcloud provider; its prices add cx23 to the default table, which prices
// cax11.
func TestSampleConfigEntry(t *testing.T) {
	pc := providertest.SampleEntry(t, "../../..", "hcloud")
	p, err := New(pc, logr.Discard())
	if err != nil || p.cfg.TokenFile != "/etc/proxy-operator/hcloud/token" || !p.cfg.HasIPv6() || !p.cfg.ManagesFirewall() {
		t.Fatalf("built %+v, %v", p, err)
	}
	for _, st := range p.cfg.ServerTypes {
		if c, ok := pc.Hourly(st); !ok || c.Currency != "EUR" {
			t.Errorf("the sample's %s costs %v %v, want a price in EUR", st, c, ok)
		}
	}
}
