package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// staticBinary builds the pause command without cgo: a small static executable.
func staticBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bin")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "../pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static binary: %v\n%s", err, b)
	}
	return out
}

// entry is one file of an image's file system.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// load reads a tarball back: its config and every file of its layers.
func load(t *testing.T, file string) (*v1.ConfigFile, map[string]entry) {
	t.Helper()
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]entry{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(tr)
			files["/"+strings.TrimSuffix(h.Name, "/")] = entry{h, data}
		}
		rc.Close()
	}
	return cf, files
}

// The Dockerfile's final stage, read here independently of finalStage.
func dockerfileFinal(t *testing.T) (entrypoint []string, user string, dests []string) {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	final := s[strings.LastIndex(s, "\nFROM "):]
	if m := regexp.MustCompile(`(?m)^ENTRYPOINT (\[.*\])$`).FindStringSubmatch(final); m != nil {
		if err := json.Unmarshal([]byte(m[1]), &entrypoint); err != nil {
			t.Fatalf("ENTRYPOINT %s: %v", m[1], err)
		}
	}
	if m := regexp.MustCompile(`(?m)^USER (\S+)$`).FindStringSubmatch(final); m != nil {
		user = m[1]
	}
	for _, m := range regexp.MustCompile(`(?m)^COPY --from=\S+ \S+ (\S+)$`).FindAllStringSubmatch(final, -1) {
		dests = append(dests, m[1])
	}
	if entrypoint == nil || user == "" || len(dests) == 0 {
		t.Fatalf("the Dockerfile's final stage lacks ENTRYPOINT, USER or COPY --from:\n%s", final)
	}
	return entrypoint, user, dests
}

// The image make image-tar builds runs what the Dockerfile's image runs: the same
// entrypoint, as the same user, each binary at its path (the manager's and the gateway's),
// on distroless/static:nonroot's layout (passwd naming nonroot 65532, CA certificates, a
// writable /tmp).
func TestImageMatchesTheDockerfile(t *testing.T) {
	entrypoint, user, dests := dockerfileFinal(t)
	if len(dests) != 2 || dests[0] != "/manager" || dests[1] != "/gateway" {
		t.Errorf("the Dockerfile's final stage copies %q, want /manager and /gateway", dests)
	}
	// One binary per COPY, each told apart by trailing bytes (an ELF file stays one).
	built := staticBinary(t)
	orig, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-dockerfile", "../../Dockerfile"}
	bins := map[string][]byte{}
	for i, dest := range dests {
		data := append(slices.Clone(orig), byte(i))
		p := filepath.Join(t.TempDir(), filepath.Base(dest))
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		bins[dest] = data
		args = append(args, "-bin", p)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := run(append(args, "-tag", "egress-proxies-operator:latest", "-o", out), io.Discard); err != nil {
		t.Fatal(err)
	}
	cf, files := load(t, out)
	if strings.Join(cf.Config.Entrypoint, " ") != strings.Join(entrypoint, " ") {
		t.Errorf("entrypoint %q, the Dockerfile's %q", cf.Config.Entrypoint, entrypoint)
	}
	if cf.Config.User != user {
		t.Errorf("user %q, the Dockerfile's %q", cf.Config.User, user)
	}
	if len(cf.Config.Cmd) != 0 {
		t.Errorf("cmd %q, the Dockerfile sets none", cf.Config.Cmd)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	for dest, want := range bins {
		if e, ok := files[dest]; !ok || !bytes.Equal(e.data, want) || e.hdr.Mode&0o111 == 0 {
			t.Errorf("%s in the image: present %v, executable and its own binary: %v", dest, ok, ok && bytes.Equal(e.data, want) && e.hdr.Mode&0o111 != 0)
		}
	}
	if !strings.Contains(string(files["/etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks distroless's nonroot user:\n%s", files["/etc/passwd"].data)
	}
	if !strings.Contains(string(files["/etc/group"].data), "nonroot:x:65532:") {
		t.Errorf("/etc/group lacks nonroot:\n%s", files["/etc/group"].data)
	}
	ca, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if got := files["/etc/ssl/certs/ca-certificates.crt"].data; len(got) == 0 || !bytes.Equal(got, ca) {
		t.Errorf("the CA bundle in the image has %d bytes, this machine's %d", len(got), len(ca))
	}
	if e := files["/tmp"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o1777 {
		t.Errorf("/tmp is not a world-writable sticky directory: %+v", e.hdr)
	}
	if e := files["/home/nonroot"]; e.hdr == nil || e.hdr.Uid != 65532 {
		t.Errorf("/home/nonroot is not nonroot's: %+v", e.hdr)
	}
	if cf.Config.WorkingDir != "/home/nonroot" {
		t.Errorf("working directory %q, distroless nonroot's is /home/nonroot", cf.Config.WorkingDir)
	}
}

// Two builds of the same inputs are the same image, byte for byte.
func TestImageIsReproducible(t *testing.T) {
	bin := staticBinary(t)
	dir := t.TempDir()
	var digests []v1.Hash
	for _, name := range []string{"a.tar", "b.tar"} {
		out := filepath.Join(dir, name)
		if err := run([]string{"-bin", bin, "-path", "/pause", "-user", "65535:65535", "-tag", "localhost/pause:1", "-o", out}, io.Discard); err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(out, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds differ: %s and %s", digests[0], digests[1])
	}
	cf, files := load(t, filepath.Join(dir, "a.tar"))
	if cf.Config.User != "65535:65535" || strings.Join(cf.Config.Entrypoint, " ") != "/pause" || files["/pause"].hdr == nil {
		t.Errorf("the pause image runs %q as %q, /pause present: %v", cf.Config.Entrypoint, cf.Config.User, files["/pause"].hdr != nil)
	}
	if !cf.Created.Time.Equal(cf.Created.Time.UTC()) || cf.Created.Unix() != 0 {
		t.Errorf("created %v, want the epoch", cf.Created)
	}
}

func TestImagebuildErrors(t *testing.T) {
	bin := staticBinary(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.tar")
	dockerfile := func(body string) string {
		p := filepath.Join(t.TempDir(), "Dockerfile")
		if err := os.WriteFile(p, []byte("FROM golang AS builder\nRUN go build\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "FROM scratch\nCOPY --from=builder /manager /manager\nUSER 65532:65532\nENTRYPOINT [\"/manager\"]\n"
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"an instruction it would leave out", []string{"-dockerfile", dockerfile(good + "ENV A=b\n"), "-bin", bin}, "", `"ENV A=b" is not supported`},
		{"a second COPY without its -bin", []string{"-dockerfile", dockerfile(good + "COPY --from=builder /x /x\n"), "-bin", bin}, "", "copies 2 binaries (/manager, /x), -bin gives 1"},
		{"a -bin without its COPY", []string{"-dockerfile", dockerfile(good), "-bin", bin, "-bin", bin}, "", "copies 1 binaries (/manager), -bin gives 2"},
		{"two COPYs to one path", []string{"-dockerfile", dockerfile(good + "COPY --from=builder /x /manager\n"), "-bin", bin, "-bin", bin}, "", "a second COPY to /manager"},
		{"a COPY of two sources", []string{"-dockerfile", dockerfile(good + "COPY --from=builder /x /y /z/\n"), "-bin", bin}, "", "one binary each"},
		{"two -bin without -dockerfile", []string{"-path", "/x", "-user", "1:1", "-bin", bin, "-bin", bin}, "", "several binaries need -dockerfile"},
		{"a shell-form entrypoint", []string{"-dockerfile", dockerfile(strings.Replace(good, `["/manager"]`, "/manager", 1)), "-bin", bin}, "", "exec-form ENTRYPOINT"},
		{"an entrypoint other than the binary", []string{"-dockerfile", dockerfile(strings.Replace(good, `["/manager"]`, `["/other"]`, 1)), "-bin", bin}, "", `ENTRYPOINT "/other" is not a copied binary (/manager)`},
		{"no USER", []string{"-dockerfile", dockerfile(strings.Replace(good, "USER 65532:65532\n", "", 1)), "-bin", bin}, "", "no USER"},
		{"a USER by name", []string{"-dockerfile", dockerfile(strings.Replace(good, "65532:65532", "nonroot", 1)), "-bin", bin}, "", "USER uid:gid is supported"},
		{"no binary copied", []string{"-dockerfile", dockerfile("FROM scratch\nUSER 1:1\nENTRYPOINT [\"/m\"]\n"), "-bin", bin}, "", "copies no binary"},
		{"a missing Dockerfile", []string{"-dockerfile", filepath.Join(dir, "nope"), "-bin", bin}, "", "reading dockerfile: open " + filepath.Join(dir, "nope")},
		{"-path beside -dockerfile", []string{"-dockerfile", dockerfile(good), "-path", "/x", "-bin", bin}, "", "come from the Dockerfile"},
		{"a relative path", []string{"-path", "pause", "-user", "1:1", "-bin", bin}, "", `-path "pause": not absolute`},
		{"a user by name", []string{"-path", "/pause", "-user", "nonroot", "-bin", bin}, "", `user "nonroot": want numeric uid:gid`},
		{"a dynamic binary", []string{"-path", "/true", "-user", "1:1", "-bin", "/bin/true"}, "", "binary /bin/true: not a statically linked ELF"},
		{"not an executable", []string{"-path", "/x", "-user", "1:1", "-bin", "../../Dockerfile"}, "", "not a statically linked ELF"},
		{"a missing binary", []string{"-path", "/x", "-user", "1:1", "-bin", filepath.Join(dir, "nope")}, "", "reading the binary: open"},
		{"a missing CA bundle", []string{"-path", "/x", "-user", "1:1", "-bin", bin, "-ca", filepath.Join(dir, "nope")}, "", "reading the CA bundle: open"},
		{"a bad tag", []string{"-path", "/x", "-user", "1:1", "-bin", bin, "-tag", "UPPER:case:x"}, "", `-tag "UPPER:case:x"`},
		{"a bad SOURCE_DATE_EPOCH", []string{"-path", "/x", "-user", "1:1", "-bin", bin}, "yesterday", `SOURCE_DATE_EPOCH "yesterday"`},
		{"no -bin", []string{"-path", "/x", "-user", "1:1"}, "", "-bin is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SOURCE_DATE_EPOCH", tc.env)
			args := tc.args
			if !strings.Contains(strings.Join(args, " "), "-tag") {
				args = append(args, "-tag", "x:1")
			}
			err := run(append(args, "-o", out), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s was written despite the error", out)
			}
		})
	}
}
