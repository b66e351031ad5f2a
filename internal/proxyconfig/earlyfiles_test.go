package proxyconfig

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// earlyEntry is one entry of the early files archive, as an image's seed unit unpacks it.
type earlyEntry struct {
	Path    string
	Mode    int64
	Content string
}

// earlyFilesOf decodes the early files line of a rendered document, entries in order.
func earlyFilesOf(t *testing.T, doc []byte) []earlyEntry {
	t.Helper()
	var line string
	n := 0
	for _, l := range strings.Split(string(doc), "\n") {
		if s, ok := strings.CutPrefix(l, EarlyFilesPrefix); ok {
			line = s
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the document has %d lines starting %q, want 1", n, EarlyFilesPrefix)
	}
	raw, err := base64.StdEncoding.DecodeString(line)
	if err != nil {
		t.Fatalf("early files line: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("early files line: %v", err)
	}
	tr := tar.NewReader(zr)
	var files []earlyEntry
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("early files archive: %v", err)
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("early files archive entry %s: type %c uid %d gid %d, want a regular file of root's", hdr.Name, hdr.Typeflag, hdr.Uid, hdr.Gid)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, earlyEntry{Path: "/" + hdr.Name, Mode: hdr.Mode, Content: string(body)})
	}
	return files
}

// TestEarlyFilesAreTheDocumentsFiles checks that the archive on the comment line holds
// exactly what cloud-init installs from the same document: bootcmd's files (0644, as its
// cat > writes them, unless a chmod follows) and then write_files' files with their permissions, byte for byte,
// the marker last, so an image that unpacks it early has tinyproxy's configuration and
// fence complete before the path unit sees the marker.
func TestEarlyFilesAreTheDocumentsFiles(t *testing.T) {
	wg, err := ParseWireGuard(sampleWGConf())
	if err != nil {
		t.Fatal(err)
	}
	withTunnel := sampleConfig()
	withTunnel.WireGuard = wg
	noAuth := sampleConfig()
	noAuth.Credentials = nil
	for name, c := range map[string]Config{"basic auth": sampleConfig(), "no auth": noAuth, "wireguard": withTunnel} {
		t.Run(name, func(t *testing.T) {
			doc, err := CloudConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			var want []earlyEntry
			paths, units, commands := bootUnits(t, doc)
			modes := map[string]int64{}
			for _, c := range commands {
				if f := strings.Fields(c); len(f) == 3 && f[0] == "chmod" {
					m, err := strconv.ParseInt(f[1], 8, 64)
					if err != nil {
						t.Fatalf("bootcmd %q: %v", c, err)
					}
					modes[f[2]] = m
				}
			}
			for _, p := range paths {
				mode, ok := modes[p]
				if !ok {
					mode = 0o644
				}
				want = append(want, earlyEntry{Path: p, Mode: mode, Content: units[p]})
			}
			var cc struct {
				WriteFiles []struct {
					Path        string `json:"path"`
					Owner       string `json:"owner"`
					Permissions string `json:"permissions"`
					Content     string `json:"content"`
				} `json:"write_files"`
			}
			if err := yaml.Unmarshal(doc, &cc); err != nil {
				t.Fatal(err)
			}
			for _, f := range cc.WriteFiles {
				mode, err := strconv.ParseInt(f.Permissions, 8, 64)
				if err != nil || f.Owner != "root:root" {
					t.Fatalf("write_files %s: permissions %q owner %q", f.Path, f.Permissions, f.Owner)
				}
				want = append(want, earlyEntry{Path: f.Path, Mode: mode, Content: f.Content})
			}
			got := earlyFilesOf(t, doc)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the early files archive is not the document's files (-document +archive):\n%s", diff)
			}
			if last := got[len(got)-1].Path; last != ConfigWrittenPath {
				t.Errorf("the archive's last file is %s, want the marker %s", last, ConfigWrittenPath)
			}
			again, err := CloudConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(doc, again) {
				t.Error("two renderings of one configuration differ: the archive must be the same bytes every time")
			}
		})
	}
}
