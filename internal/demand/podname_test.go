package demand

import (
	"os"
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
