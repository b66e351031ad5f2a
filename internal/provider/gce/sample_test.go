package gce

import (
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// TestSampleConfigEntry: the commented gce example of config/samples/providers-config.yaml,
// uncommented, is a valid providers config that builds a gce provider.
func TestSampleConfigEntry(t *testing.T) {
	data, err := os.ReadFile("../../../config/samples/providers-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "# --- gce example ---\n")
	block, _, ok2 := strings.Cut(rest, "# --- end of gce example ---")
	if !ok || !ok2 {
		t.Fatal("no gce example between the markers")
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(block, " \n"), "\n") {
		lines = append(lines, strings.Replace(l, "# ", "", 1))
	}
	cfg, err := provider.ParseConfig([]byte("providers:\n" + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatalf("the sample gce entry: %v", err)
	}
	p, err := New(cfg.Providers[0], logr.Discard())
	if err != nil || p.cfg.Project != "my-proxies-project" || !p.cfg.Spot {
		t.Fatalf("built %+v, %v", p, err)
	}
}
