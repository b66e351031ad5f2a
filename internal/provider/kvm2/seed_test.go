package kvm2

import (
	"bytes"
	"compress/gzip"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSeedISOReadByIsoinfo reads the seed back with genisoimage's isoinfo, a reader
// that shares no code with the writer: the label, the exact file names and every byte.
func TestSeedISOReadByIsoinfo(t *testing.T) {
	isoinfo, err := exec.LookPath("isoinfo")
	if err != nil {
		t.Fatal("isoinfo not found: install genisoimage (hack/deps.sh does, and make test-unit runs it)")
	}
	// A gzipped user-data: not text, so any re-encoding would show.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("#cloud-config\npackages: [tinyproxy]\n"))
	_ = zw.Close()
	userData := append(gz.Bytes(), 0, 0xff, '\r', '\n')
	vendor := vendorData("#cloud-config\nntp: {enabled: true}\n", true)

	iso, err := buildSeedISO("proxy-0123456789abcdef", userData, vendor)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := os.WriteFile(path, iso, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(isoinfo, append([]string{"-i", path}, args...)...).Output()
		if err != nil {
			t.Fatalf("isoinfo %v: %v", args, err)
		}
		return out
	}
	if d := string(run("-d")); !strings.Contains(d, "\nVolume id: cidata\n") {
		t.Fatalf("isoinfo -d does not show label cidata:\n%s", d)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(run("-f"))), "\n") {
		names = append(names, strings.TrimSpace(l))
	}
	sort.Strings(names)
	if diff := cmp.Diff([]string{"/meta-data;1", "/user-data;1", "/vendor-data;1"}, names); diff != "" {
		t.Fatalf("files on the seed (-want +got):\n%s", diff)
	}
	for name, want := range map[string][]byte{
		"user-data":   userData,
		"meta-data":   []byte("instance-id: proxy-0123456789abcdef\nlocal-hostname: proxy-0123456789abcdef\n"),
		"vendor-data": vendor,
	} {
		if got := run("-x", "/"+name+";1"); !bytes.Equal(got, want) {
			t.Errorf("%s on the seed is %q, want %q", name, got, want)
		}
	}
}

// TestSeedStagingRemoved: the ISO is staged under the temp directory, which must hold
// nothing once buildSeedISO returns (the manager's /tmp is a small emptyDir).
func TestSeedStagingRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for range 3 {
		if _, err := buildSeedISO("proxy-1", []byte("#cloud-config\n"), nil); err != nil {
			t.Fatal(err)
		}
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("buildSeedISO left %d entries in TMPDIR, first %q", len(left), left[0].Name())
	}
	t.Setenv("TMPDIR", filepath.Join(tmp, "missing"))
	if _, err := buildSeedISO("proxy-1", nil, nil); err == nil || !strings.Contains(err.Error(), "proxy-1") {
		t.Fatalf("an unusable TMPDIR: got %v, want an error naming the seed", err)
	}
}

func TestVendorData(t *testing.T) {
	const doc = "#cloud-config\nntp: {enabled: true}\n"
	if got := string(vendorData("", true)); got != guestAgentScript {
		t.Errorf("agent only: got %q", got)
	}
	if got := string(vendorData(doc, false)); got != doc {
		t.Errorf("vendorData only: got %q", got)
	}
	if got := vendorData("", false); len(got) != 0 {
		t.Errorf("neither: got %q", got)
	}
	both := vendorData(doc, true)
	if !bytes.HasPrefix(both, []byte("MIME-Version: 1.0\r\n")) {
		t.Fatalf("multipart must start with MIME-Version: %q", both[:40])
	}
	if !bytes.Equal(both, vendorData(doc, true)) {
		t.Error("the same inputs gave different vendor-data")
	}
	msg, err := mail.ReadMessage(bytes.NewReader(both))
	if err != nil {
		t.Fatal(err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("content type %q: %v", msg.Header.Get("Content-Type"), err)
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	var parts []string
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(p)
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		parts = append(parts, ct+"\x00"+string(body))
	}
	want := []string{"text/plain\x00" + doc, "text/x-shellscript\x00" + guestAgentScript}
	if diff := cmp.Diff(want, parts); diff != "" {
		t.Fatalf("parts, as type NUL body (-want +got):\n%s", diff)
	}
}

// TestGuestAgentScript runs the script under sh with stub package managers and init
// tools on PATH: it picks the one present, installs and starts the agent, logs, and does
// not install again once the agent exists.
func TestGuestAgentScript(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal("no sh on PATH")
	}
	chmod, err := exec.LookPath("chmod")
	if err != nil {
		t.Fatal("no chmod on PATH")
	}
	cases := []struct {
		tools   []string
		install string
		start   string
	}{
		{[]string{"apt-get", "systemctl"}, "apt-get install -y -q --no-install-recommends qemu-guest-agent", "systemctl start qemu-guest-agent"},
		{[]string{"dnf", "systemctl"}, "dnf install -y qemu-guest-agent", "systemctl start qemu-guest-agent"},
		{[]string{"yum", "systemctl"}, "yum install -y qemu-guest-agent", "systemctl start qemu-guest-agent"},
		{[]string{"zypper", "systemctl"}, "zypper --non-interactive install qemu-guest-agent", "systemctl start qemu-guest-agent"},
		{[]string{"apk", "rc-service", "rc-update"}, "apk add --no-cache qemu-guest-agent", "rc-service qemu-guest-agent start"},
	}
	for _, c := range cases {
		t.Run(c.tools[0], func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			calls := filepath.Join(dir, "calls")
			logFile := filepath.Join(dir, "cloud-init-output.log")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, tool := range c.tools {
				// Each stub records its call; a package manager also "installs" qemu-ga.
				stub := "#!" + sh + "\necho \"${0##*/} $*\" >>" + calls + "\n"
				if tool != "systemctl" && tool != "rc-service" && tool != "rc-update" {
					stub += "printf '#!" + sh + "\\n' >" + filepath.Join(bin, "qemu-ga") + "; " + chmod + " +x " + filepath.Join(bin, "qemu-ga") + "\n"
				}
				if err := os.WriteFile(filepath.Join(bin, tool), []byte(stub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// Point the log and the fixed agent paths into dir, so the host's own files
			// play no part.
			script := strings.NewReplacer("/var/log/cloud-init-output.log", logFile,
				"/usr/bin/qemu-ga", filepath.Join(dir, "usr-bin-qemu-ga"),
				"/usr/sbin/qemu-ga", filepath.Join(dir, "usr-sbin-qemu-ga")).Replace(guestAgentScript)
			run := func() string {
				cmd := exec.Command(sh, "-c", script)
				cmd.Env = []string{"PATH=" + bin + ":/nonexistent"}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("script: %v\n%s", err, out)
				}
				b, _ := os.ReadFile(calls)
				return string(b)
			}
			first := run()
			if !strings.Contains(first, c.install+"\n") || !strings.Contains(first, c.start+"\n") {
				t.Fatalf("first run made calls:\n%s\nwant %q and %q", first, c.install, c.start)
			}
			second := run()[len(first):]
			if strings.Contains(second, "install") || strings.Contains(second, "apk add") || !strings.Contains(second, c.start) {
				t.Fatalf("second run (agent present) made calls:\n%s", second)
			}
			if b, _ := os.ReadFile(logFile); !strings.Contains(string(b), "agent already installed") {
				t.Fatalf("log file lacks the second run's note:\n%s", b)
			}
		})
	}
}
