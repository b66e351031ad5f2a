package proxyconfig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// linkRetryRun runs the link-retry script under sh with stubs for networkctl (whose
// enp1s0 starts in setup state `state` and becomes configured once reconfigured, unless
// stuck), systemctl (networkd enabled or not) and sleep (no wait). It returns the script's
// exit code, its output and the networkctl calls other than list.
func linkRetryRun(t *testing.T, state string, stuck, networkd, hasNetworkctl bool) (int, string, []string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	for _, tool := range []string{"awk", "cat"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		os.Symlink(p, filepath.Join(bin, tool))
	}
	stateFile, calls := filepath.Join(dir, "state"), filepath.Join(dir, "calls")
	os.WriteFile(stateFile, []byte(state), 0o644)
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if hasNetworkctl {
		after := "configured"
		if stuck {
			after = "failed"
		}
		write("networkctl", `case "$1" in
list) printf '  1 lo     loopback carrier  unmanaged\n  2 enp1s0 ether    routable  %s\n' "$(cat `+stateFile+`)" ;;
*) echo "$*" >>`+calls+`; echo `+after+` >`+stateFile+` ;;
esac
`)
	}
	if networkd {
		write("systemctl", "exit 0\n")
	} else {
		write("systemctl", "exit 1\n")
	}
	write("sleep", "exit 0\n")
	cmd := exec.Command("/bin/sh", "-c", linkRetryScript)
	cmd.Env = []string{"PATH=" + bin}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(calls)
	return code, string(out), strings.Fields(strings.ReplaceAll(string(b), "\n", "|"))
}

// The link-retry script has networkd configure again a link it marked failed, and stops
// once one is configured; it does nothing where networkd is not the image's network; it
// gives up, saying so, after five minutes.
func TestLinkRetryScript(t *testing.T) {
	code, out, calls := linkRetryRun(t, "failed", false, true, true)
	if code != 0 || !strings.Contains(out, "link enp1s0 failed; asking networkd to configure it again") ||
		strings.Join(calls, " ") != "reconfigure enp1s0|" {
		t.Errorf("a failed link: exit %d, output %q, networkctl calls %q; want exit 0 after one reconfigure", code, out, calls)
	}
	if code, out, calls := linkRetryRun(t, "configured", false, true, true); code != 0 || out != "" || len(calls) != 0 {
		t.Errorf("a configured link: exit %d, output %q, calls %q; want exit 0 and nothing done", code, out, calls)
	}
	if code, out, calls := linkRetryRun(t, "failed", false, false, true); code != 0 || out != "" || len(calls) != 0 {
		t.Errorf("networkd not in use: exit %d, output %q, calls %q; want exit 0 and nothing done", code, out, calls)
	}
	if code, out, _ := linkRetryRun(t, "failed", false, true, false); code != 0 || out != "" {
		t.Errorf("no networkctl: exit %d, output %q; want exit 0", code, out)
	}
	code, out, calls = linkRetryRun(t, "failed", true, true, true)
	if code != 1 || !strings.Contains(out, "no en* link configured after 300 s") || len(calls) == 0 {
		t.Errorf("a link that stays failed: exit %d, %d reconfigures, output ending %q; want exit 1 saying so", code, len(calls), out[max(0, len(out)-80):])
	}
}
