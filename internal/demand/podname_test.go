package demand

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PodName is POD_NAME when set, else the host name.
func TestPodName(t *testing.T) {
	t.Setenv("POD_NAME", "gateway-7d9f-x2")
	if got := PodName("gateway"); got != "gateway-7d9f-x2" {
		t.Errorf("with POD_NAME: %q", got)
	}
	t.Setenv("POD_NAME", "")
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skipf("no host name here: %v", err)
	}
	if got := PodName("gateway"); got != host {
		t.Errorf("without POD_NAME: %q, want the host name %q", got, host)
	}
}

// The default demand namespace is POD_NAMESPACE, else the service account's namespace
// file, else "default"; each says where it came from.
func TestDefaultNamespace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "namespace")
	if err := os.WriteFile(file, []byte("egress-system\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAMESPACE", "operators")
	if ns, from := defaultNamespace(file); ns != "operators" || from != "POD_NAMESPACE" {
		t.Errorf("with POD_NAMESPACE: %q from %q, want operators from POD_NAMESPACE", ns, from)
	}
	t.Setenv("POD_NAMESPACE", "")
	if ns, from := defaultNamespace(file); ns != "egress-system" || from != file {
		t.Errorf("with the namespace file: %q from %q, want egress-system from %s", ns, from, file)
	}
	if ns, from := defaultNamespace(filepath.Join(t.TempDir(), "missing")); ns != "default" || from != "default" {
		t.Errorf("with neither: %q from %q, want default", ns, from)
	}
}

// --demand-namespace: a namespace name is taken as given, an empty value is the default,
// anything else is refused naming the flag.
func TestFlagNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "operators")
	if ns, from, err := FlagNamespace("egress"); err != nil || ns != "egress" || from != "--demand-namespace" {
		t.Errorf("FlagNamespace(egress) = %q, %q, %v", ns, from, err)
	}
	if ns, from, err := FlagNamespace(""); err != nil || ns != "operators" || from != "POD_NAMESPACE" {
		t.Errorf("FlagNamespace(\"\") = %q, %q, %v; want the pod's namespace", ns, from, err)
	}
	if _, _, err := FlagNamespace("Not_A/Namespace"); err == nil || !strings.Contains(err.Error(), "--demand-namespace") {
		t.Errorf("FlagNamespace of a bad name = %v, want an error naming --demand-namespace", err)
	}
}
