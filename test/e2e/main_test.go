//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestMain gives controller-runtime's logger (envtest's control plane logs through it) a
// sink, so that it does not print a stack trace warning that none was set.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}
