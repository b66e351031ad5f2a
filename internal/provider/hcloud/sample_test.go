package hcloud

import (
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// TestSampleConfigEntry: the commented hcloud example of
// config/samples/providers-config.yaml, uncommented, is a valid providers config that
// builds an hcloud provider.
func TestSampleConfigEntry(t *testing.T) {
	data, err := os.ReadFile("../../../config/samples/providers-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "# --- hcloud example ---\n")
	block, _, ok2 := strings.Cut(rest, "# --- end of hcloud example ---")
	if !ok || !ok2 {
		t.Fatal("no hcloud example between the markers")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(block, " \n"), "\n") {
		lines = append(lines, strings.Replace(l, "# ", "", 1))
	}
	cfg, err := provider.ParseConfig([]byte("providers:\n" + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatalf("the sample hcloud entry: %v", err)
	}
	p, err := New(cfg.Providers[0], logr.Discard())
	if err != nil || p.cfg.TokenFile != "/etc/proxy-operator/hcloud/token" || !p.cfg.HasIPv6() || !p.cfg.ManagesFirewall() {
		t.Fatalf("built %+v, %v", p, err)
	}
}
