// Command imagebuild writes a container image as a tarball without a container daemon and
// without pulling anything: one static binary on an empty base, with the layout of
// distroless/static:nonroot around it (/etc/passwd and /etc/group naming root, nobody and
// nonroot 65532, CA certificates, /tmp, the nonroot home). The tarball is in the format
// `docker save` writes, so `ctr images import`, `podman load` and `docker load` take it,
// and `crane push` sends it to a registry.
//
//	imagebuild -dockerfile Dockerfile -bin bin/image/manager -tag egress-proxies-operator:latest -o bin/image/manager.tar
//	imagebuild -bin bin/image/pause -path /pause -user 65535:65535 -tag localhost/epo-pause:1 -o bin/image/pause.tar
//
// With -dockerfile the binaries' paths in the image, the entrypoint and the user are read
// from the Dockerfile's final stage, so both builds give the same image: that stage may
// hold only FROM, one or more COPY --from=<stage> SRC DEST of a binary each, USER and an
// exec-form ENTRYPOINT of one of the copied binaries; anything else is refused rather
// than silently left out. -bin is then given once per COPY, in the COPYs' order (the
// operator's image: -bin bin/image/manager -bin bin/image/gateway).
//
// The output is reproducible: every file carries the time of SOURCE_DATE_EPOCH (default
// 0), and so does the config.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// spec is what goes into one image.
type spec struct {
	Binaries []string // the files on this machine
	Paths    []string // where each lands in the image
	Path     string   // the entrypoint, one of Paths
	User     string   // uid:gid
	CA       string   // CA bundle on this machine; empty: none
	Tag      string
	Out      string
	Epoch    time.Time
}

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	var s spec
	var dockerfile string
	fs := flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&dockerfile, "dockerfile", "", "Dockerfile whose final stage gives the binaries' paths, the entrypoint and the user.")
	fs.Func("bin", "A static binary to put in the image; with -dockerfile once per COPY of its final stage, in their order.", func(v string) error {
		s.Binaries = append(s.Binaries, v)
		return nil
	})
	fs.StringVar(&s.Path, "path", "", "The binary's path in the image, also the entrypoint (without -dockerfile).")
	fs.StringVar(&s.User, "user", "", "uid:gid the image runs as (without -dockerfile).")
	fs.StringVar(&s.CA, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to put at /etc/ssl/certs/ca-certificates.crt; empty: none.")
	fs.StringVar(&s.Tag, "tag", "", "The image's name, as the tarball records it.")
	fs.StringVar(&s.Out, "o", "", "The tarball to write.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dockerfile != "" {
		if s.Path != "" || s.User != "" {
			return errors.New("-path and -user come from the Dockerfile when -dockerfile is given")
		}
		f, err := finalStage(dockerfile)
		if err != nil {
			return err
		}
		s.Path, s.Paths, s.User = f.Entrypoint, f.Paths, f.User
		if len(s.Binaries) != len(s.Paths) {
			return fmt.Errorf("dockerfile %s: the final stage copies %d binaries (%s), -bin gives %d: give -bin once per COPY, in their order",
				dockerfile, len(s.Paths), strings.Join(s.Paths, ", "), len(s.Binaries))
		}
	} else {
		if len(s.Binaries) > 1 {
			return errors.New("-bin given more than once: several binaries need -dockerfile, whose COPYs place them")
		}
		s.Paths = []string{s.Path}
	}
	var bin string
	if len(s.Binaries) > 0 {
		bin = s.Binaries[0]
	}
	for flagName, v := range map[string]string{"-bin": bin, "-path": s.Path, "-user": s.User, "-tag": s.Tag, "-o": s.Out} {
		if v == "" {
			return fmt.Errorf("%s is required", flagName)
		}
	}
	epoch, err := sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return err
	}
	s.Epoch = epoch
	return build(s)
}

func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", v, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

// stage is what imagebuild takes from a Dockerfile's final stage.
type stage struct {
	Paths      []string // each COPY's destination, in order
	Entrypoint string   // one of Paths
	User       string
}

// finalStage reads the final stage of a Dockerfile; see the package comment for what it
// accepts.
func finalStage(file string) (stage, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return stage{}, fmt.Errorf("reading dockerfile: %w", err)
	}
	var lines []string
	cur := ""
	for l := range strings.SplitSeq(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur += s + " "
			continue
		}
		lines = append(lines, cur+l)
		cur = ""
	}
	start := -1
	for i, l := range lines {
		if strings.EqualFold(strings.Fields(l)[0], "FROM") {
			start = i
		}
	}
	if start < 0 {
		return stage{}, fmt.Errorf("dockerfile %s: no FROM", file)
	}
	var st stage
	var entrypoint string
	for _, l := range lines[start+1:] {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "COPY":
			if len(f) != 4 || !strings.HasPrefix(f[1], "--from=") {
				return stage{}, fmt.Errorf("dockerfile %s: the final stage's %q: only COPY --from=<stage> SRC DEST, one binary each, is supported", file, l)
			}
			if slices.Contains(st.Paths, f[3]) {
				return stage{}, fmt.Errorf("dockerfile %s: the final stage's %q: a second COPY to %s", file, l, f[3])
			}
			st.Paths = append(st.Paths, f[3])
		case "USER":
			if len(f) != 2 || !strings.Contains(f[1], ":") {
				return stage{}, fmt.Errorf("dockerfile %s: %q: USER uid:gid is supported", file, l)
			}
			st.User = f[1]
		case "ENTRYPOINT":
			var ep []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(l[len(f[0]):])), &ep); err != nil || len(ep) != 1 {
				return stage{}, fmt.Errorf("dockerfile %s: %q: only an exec-form ENTRYPOINT of the binary alone is supported", file, l)
			}
			entrypoint = ep[0]
		default:
			return stage{}, fmt.Errorf("dockerfile %s: the final stage's %q is not supported (imagebuild would leave it out)", file, l)
		}
	}
	switch {
	case len(st.Paths) == 0:
		return stage{}, fmt.Errorf("dockerfile %s: the final stage copies no binary", file)
	case st.User == "":
		return stage{}, fmt.Errorf("dockerfile %s: the final stage has no USER", file)
	case !slices.Contains(st.Paths, entrypoint):
		return stage{}, fmt.Errorf("dockerfile %s: the ENTRYPOINT %q is not a copied binary (%s)", file, entrypoint, strings.Join(st.Paths, ", "))
	}
	st.Entrypoint = entrypoint
	return st, nil
}

// The nonroot user of distroless, whose home the image's working directory is.
const (
	nonrootUID  = 65532
	nonrootHome = "/home/nonroot"
)

func build(s spec) error {
	for _, p := range s.Paths {
		if !path.IsAbs(p) {
			return fmt.Errorf("-path %q: not absolute", p)
		}
	}
	uid, err := parseUser(s.User)
	if err != nil {
		return err
	}
	bins := make([][]byte, len(s.Binaries))
	for i, file := range s.Binaries {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("reading the binary: %w", err)
		}
		if !isStaticELF(b) {
			return fmt.Errorf("binary %s: not a statically linked ELF executable (build it with CGO_ENABLED=0)", file)
		}
		bins[i] = b
	}
	var ca []byte
	if s.CA != "" {
		if ca, err = os.ReadFile(s.CA); err != nil {
			return fmt.Errorf("reading the CA bundle: %w", err)
		}
	}
	layerTar, err := rootfs(s, bins, ca)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("the image layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("the image layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.Epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{s.Path},
		User:       s.User,
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
	}
	if uid == nonrootUID {
		cf.Config.WorkingDir = nonrootHome
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("the image config: %w", err)
	}
	ref, err := name.NewTag(s.Tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", s.Tag, err)
	}
	tmp := s.Out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", s.Out, err)
	}
	return os.Rename(tmp, s.Out)
}

// parseUser checks a numeric uid:gid and returns the uid.
func parseUser(u string) (int, error) {
	us, gs, ok := strings.Cut(u, ":")
	uid, err := strconv.Atoi(us)
	gid, gerr := strconv.Atoi(gs)
	if !ok || err != nil || gerr != nil || uid < 0 || gid < 0 {
		return 0, fmt.Errorf("user %q: want numeric uid:gid", u)
	}
	return uid, nil
}

// isStaticELF: an ELF executable without a PT_INTERP program header, that is without a
// dynamic loader to find in an empty image.
func isStaticELF(b []byte) bool {
	if len(b) < 64 || string(b[:4]) != "\x7fELF" || b[4] != 2 || b[5] != 1 { // 64-bit little-endian
		return false
	}
	le := func(off, n int) uint64 {
		var v uint64
		for i := n - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[off+i])
		}
		return v
	}
	phoff, phentsize, phnum := int(le(32, 8)), int(le(54, 2)), int(le(56, 2))
	for i := range phnum {
		off := phoff + i*phentsize
		if off+4 > len(b) {
			return false
		}
		if le(off, 4) == 3 { // PT_INTERP
			return false
		}
	}
	return true
}

// rootfs is the image's one layer, as an uncompressed tar.
func rootfs(s spec, bins [][]byte, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	dir := func(p string, mode int64, owner int) error {
		if dirs[p] {
			return nil
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: mode,
			Uid: owner, Gid: owner, ModTime: s.Epoch, Format: tar.FormatPAX})
	}
	parents := func(p string) error {
		var walk []string
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			walk = append([]string{d}, walk...)
		}
		for _, d := range walk {
			if err := dir(d, 0o755, 0); err != nil {
				return err
			}
		}
		return nil
	}
	file := func(p string, mode int64, data []byte) error {
		if err := parents(p); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: mode,
			Size: int64(len(data)), ModTime: s.Epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	steps := []func() error{
		func() error { return dir("/etc", 0o755, 0) },
		func() error { return file("/etc/passwd", 0o644, []byte(passwd)) },
		func() error { return file("/etc/group", 0o644, []byte(group)) },
		func() error { return file("/etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")) },
		func() error { return dir("/home", 0o755, 0) },
		func() error { return dir(nonrootHome, 0o700, nonrootUID) },
		func() error { return dir("/root", 0o700, 0) },
		func() error { return dir("/tmp", 0o1777, 0) },
	}
	if ca != nil {
		steps = append(steps, func() error { return file("/etc/ssl/certs/ca-certificates.crt", 0o644, ca) })
	}
	for i, p := range s.Paths {
		steps = append(steps, func() error { return file(p, 0o755, bins[i]) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, fmt.Errorf("the image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("the image layer: %w", err)
	}
	return buf.Bytes(), nil
}
