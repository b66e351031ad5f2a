package lib_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// runSeedFiles runs guest-seed-files.sh on userData with the root R, as the test image's
// seed unit does at boot (less the mount and systemctl), and returns R and the output.
func runSeedFiles(t *testing.T, userData []byte) (string, string) {
	t.Helper()
	dir := t.TempDir()
	ud := filepath.Join(dir, "user-data")
	if err := os.WriteFile(ud, userData, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "./guest-seed-files.sh", "--user-data", ud, "--root", root).CombinedOutput()
	if err != nil {
		t.Fatalf("guest-seed-files.sh: %v\n%s", err, out)
	}
	return root, string(out)
}

// filesUnder lists the regular files under root as /path -> "mode content".
func filesUnder(t *testing.T, root string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got[strings.TrimPrefix(p, root)] = strconv.FormatUint(uint64(info.Mode().Perm()), 8) + " " + string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestSeedFilesUnpackTheRenderedFiles runs the test image's seed script on the user-data
// the operator renders, alone and after a user's own cloud-config (a MIME multipart): it
// must install every write_files file with its permissions and content, and the units
// that start tinyproxy, exactly as cloud-init would; on a user-data the operator did not
// render it must install nothing and leave the guest to cloud-init.
func TestSeedFilesUnpackTheRenderedFiles(t *testing.T) {
	c := proxyconfig.Config{
		Port:                3128,
		AllowedSourceRanges: []string{"10.0.0.0/8"},
		Credentials:         &proxyconfig.Credentials{Username: "crawler", Password: "p4ss-word"},
	}
	rendered, err := proxyconfig.CloudConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	var cc struct {
		WriteFiles []struct {
			Path        string `json:"path"`
			Permissions string `json:"permissions"`
			Content     string `json:"content"`
		} `json:"write_files"`
	}
	if err := yaml.Unmarshal(rendered, &cc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, f := range cc.WriteFiles {
		want[f.Path] = strings.TrimPrefix(f.Permissions, "0") + " " + f.Content
	}
	units := []string{proxyconfig.TinyproxyDropInPath, proxyconfig.FenceRetryUnitPath, proxyconfig.TinyproxyStartUnitPath, proxyconfig.TinyproxyPathUnitPath}

	multipart, err := proxyconfig.UserData(c, "#cloud-config\npackages: [curl]\n")
	if err != nil {
		t.Fatal(err)
	}
	for name, ud := range map[string][]byte{"rendered alone": rendered, "after a user's cloud-config": multipart} {
		t.Run(name, func(t *testing.T) {
			root, out := runSeedFiles(t, ud)
			got := filesUnder(t, root)
			for p, w := range want {
				if got[p] != w {
					t.Errorf("%s: got %q, want %q", p, got[p], w)
				}
			}
			for _, u := range units {
				if !strings.HasPrefix(got[u], "644 # Rendered by egress-proxies-operator") {
					t.Errorf("unit %s: got %q, want the rendered unit, mode 644", u, got[u])
				}
			}
			// The link-retry unit and its script, the same files the test image carries.
			linkRetry := map[string]string{proxyconfig.LinkRetryUnitPath: "644 [Unit]", proxyconfig.LinkRetryScriptPath: "755 #!/bin/sh"}
			for p, prefix := range linkRetry {
				if !strings.HasPrefix(got[p], prefix) {
					t.Errorf("%s: got %.40q, want it to start %q", p, got[p], prefix)
				}
			}
			if len(got) != len(want)+len(units)+len(linkRetry) {
				keys := make([]string, 0, len(got))
				for k := range got {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				t.Errorf("installed %d files %v, want the %d write_files, %d units and the link retry's 2 files", len(got), keys, len(want), len(units))
			}
			if !strings.Contains(out, "unpacked "+strconv.Itoa(len(want)+len(units)+len(linkRetry))+" rendered files") {
				t.Errorf("output %q does not say how many files it unpacked", out)
			}
		})
	}
	t.Run("not rendered by the operator", func(t *testing.T) {
		root, out := runSeedFiles(t, []byte("#cloud-config\npackages: [curl]\n"))
		if got := filesUnder(t, root); len(got) != 0 {
			t.Errorf("installed %v from a user-data without rendered files", got)
		}
		if !strings.Contains(out, "carries no rendered files") {
			t.Errorf("output %q does not say the user-data carries no rendered files", out)
		}
	})
}
