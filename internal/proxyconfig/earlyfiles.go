package proxyconfig

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// EarlyFilesPrefix starts the one comment line of the rendered cloud-config that carries
// every file the rendering installs (bootcmd's units and write_files' files, the marker
// ConfigWrittenPath last) as a base64 gzipped tar. cloud-init ignores the comment. An
// image that wants tinyproxy up before cloud-init's Python has started (the test image
// built by hack/guest-image.sh, whose seed unit reads the NoCloud seed's user-data as soon
// as the seed's device appears) unpacks it into / and starts TinyproxyPathUnit; cloud-init
// later writes the same bytes again, which changes nothing. The comment holds nothing the
// document does not hold already (the password is in tinyproxy's configuration below), so
// it changes no one's access to it.
const EarlyFilesPrefix = "# egress-proxies-operator-files: "

// earlyFile is one file of the rendering: where it goes, its mode and its content.
type earlyFile struct {
	path    string
	mode    int64
	content string
}

// earlyFilesLine is the comment line (with its newline) for files, in their order. The
// archive is the same bytes for the same files: no times, owners by number (root), and
// gzip without a name or time, so the user-data (and the spec hash) stays stable.
func earlyFilesLine(files []earlyFile) (string, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return "", fmt.Errorf("early files archive: %w", err)
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     strings.TrimPrefix(f.path, "/"),
			Mode:     f.mode,
			Size:     int64(len(f.content)),
			ModTime:  time.Unix(0, 0),
			Format:   tar.FormatUSTAR,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("early files archive, %s: %w", f.path, err)
		}
		if _, err := tw.Write([]byte(f.content)); err != nil {
			return "", fmt.Errorf("early files archive, %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("early files archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("early files archive: %w", err)
	}
	return EarlyFilesPrefix + base64.StdEncoding.EncodeToString(buf.Bytes()) + "\n", nil
}

// parsePerm reads a write_files permissions string ("0600") as a mode.
func parsePerm(perm string) int64 {
	m, err := strconv.ParseInt(perm, 8, 64)
	if err != nil {
		panic(fmt.Sprintf("proxyconfig: permissions %q are not octal", perm)) // constants only
	}
	return m
}
