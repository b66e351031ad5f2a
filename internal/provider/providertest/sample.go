package providertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// SampleEntry is the commented example entry of type typ in
// config/samples/providers-config.yaml (the lines between "# --- typ example ---" and
// "# --- end of typ example ---"), uncommented and parsed as a providers config: what a
// user who uncomments it gets. root is the path from the test's package to the
// repository's root. It fails the test when the markers are missing or the entry does
// not parse.
func SampleEntry(t testing.TB, root, typ string) provider.ProviderConfig {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "samples", "providers-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "# --- "+typ+" example ---\n")
	block, _, ok2 := strings.Cut(rest, "# --- end of "+typ+" example ---")
	if !ok || !ok2 {
		t.Fatalf("no %s example between the markers", typ)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(block, " \n"), "\n") {
		lines = append(lines, strings.Replace(l, "# ", "", 1))
	}
	cfg, err := provider.ParseConfig([]byte("providers:\n" + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatalf("the sample %s entry: %v", typ, err)
	}
	return cfg.Providers[0]
}
