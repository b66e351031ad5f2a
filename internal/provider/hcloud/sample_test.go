package hcloud

import (
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestSampleConfigEntry: the commented hcloud example of
// config/samples/providers-config.yaml, uncommented, is a valid providers config that
// builds an hcloud provider.
func TestSampleConfigEntry(t *testing.T) {
	p, err := New(providertest.SampleEntry(t, "../../..", "hcloud"), logr.Discard())
	if err != nil || p.cfg.TokenFile != "/etc/proxy-operator/hcloud/token" || !p.cfg.HasIPv6() || !p.cfg.ManagesFirewall() {
		t.Fatalf("built %+v, %v", p, err)
	}
}
