package proxyconfig

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"net/textproto"
	"path"
	"strings"
	"unicode/utf8"
)

// CloudConfig renders the #cloud-config document that configures tinyproxy behind the
// guest egress fence (fence.go), so that tinyproxy starts once, with the rendered
// configuration, after the fence is loaded, or not at all, and as early as cloud-init can
// make that happen:
//
//   - bootcmd, first in cloud-init's network stage (cloud-init.service): the systemd drop-in
//     for tinyproxy.service (TinyproxyDropInPath: no default dependencies, so not after
//     sysinit.target and with it the whole of that stage; ConditionPathExists the marker
//     below; ExecStartPre the fence script; OnFailure= the retry unit), the retry unit
//     (FenceRetryUnitPath: after a start that found no address, wait for one and start
//     tinyproxy again), the one-shot start unit (TinyproxyStartUnitPath: start tinyproxy
//     once per boot), the path unit (TinyproxyPathUnitPath: start that unit when the
//     marker exists), a daemon-reload and the path unit's start. They cannot be write_files
//     entries: write_files runs after bootcmd, and systemd reads tinyproxy.service when the
//     boot begins, so without the reload the drop-in would take effect only on the next
//     boot (and a unit named before its file exists is remembered as missing); and the
//     link-retry unit with its script (LinkRetryUnit, linkretry.go), enabled and started
//     at once: on an image whose networkd failed the NIC at boot, cloud-init's network
//     stage runs after systemd-networkd-wait-online gives up, and the unit then has the
//     link configured again, so a stock image mends the DHCP race the test image mends
//     itself; enabled, it starts with networkd on every later boot (a remediation's
//     reboot) instead of waiting for cloud-init;
//   - write_files, right after bootcmd in the same stage: tinyproxy's configuration at
//     TinyproxyConfPath (root:root 0600, since it may hold the password; tinyproxy reads it
//     as root before it drops to its user), the nftables ruleset and the fence script, and
//     last the marker ConfigWrittenPath. cloud-init writes the files one after the other,
//     so when the marker exists the others are complete: the path unit starts tinyproxy
//     then, while cloud-init goes on with its slower modules. On an image with tinyproxy
//     and nftables (the test image, stock Debian and Ubuntu) that is tinyproxy's one start:
//     it never serves with the image's own configuration (the start systemd queued at boot
//     is skipped by the condition), and nothing waits for cloud-init's later stages;
//   - with WireGuard egress (Config.WireGuard), write_files also holds the tunnel's wg(8)
//     configuration (0600, the private key) and its script (WireGuardScriptPath), before
//     the marker, a second ExecStartPre of tinyproxy after the fence, and runcmd installs
//     wireguard-tools before tinyproxy when the image lacks wg;
//   - runcmd, in the final stage: install nftables, then tinyproxy, with apt-get only when
//     the image lacks them (cloud-init's packages: would run the package manager on every
//     image, and on one without a reachable mirror that costs minutes of failing apt-get
//     update), keeping the configuration written above; then start tinyproxy, which does
//     nothing when it runs already and fails, leaving it stopped, when the fence cannot be
//     loaded;
//   - a comment line (EarlyFilesPrefix, earlyfiles.go) carrying the files bootcmd and
//     write_files install as one archive, for an image that installs them from its seed
//     before cloud-init's Python has started (the test image does, hack/lib/guest-seed-files.sh);
//   - merge_how: when combined with the user's cloud-config, lists (bootcmd, write_files,
//     runcmd) are appended to the user's and the user's other keys are kept.
func CloudConfig(c Config) ([]byte, error) {
	conf, allowed, err := tinyproxyConf(c)
	if err != nil {
		return nil, err
	}
	units := []struct {
		path, content string
		mode          int64
	}{
		{TinyproxyDropInPath, tinyproxyDropIn(c.WireGuard != nil), 0o644},
		{FenceRetryUnitPath, fenceRetryUnit, 0o644},
		{TinyproxyStartUnitPath, tinyproxyStartUnit, 0o644},
		{TinyproxyPathUnitPath, tinyproxyPathUnit, 0o644},
		{LinkRetryScriptPath, linkRetryScript, 0o755},
		{LinkRetryUnitPath, linkRetryUnit, 0o644},
	}
	files := []struct{ path, perm, content string }{
		{TinyproxyConfPath, "0600", conf},
		{FenceRulesetPath, "0644", fenceRuleset(allowed)},
		{FenceScriptPath, "0755", fenceScript},
	}
	install := []string{installIfMissing("nft", "nftables")}
	if c.WireGuard != nil {
		files = append(files,
			struct{ path, perm, content string }{WireGuardConfPath, "0600", c.WireGuard.setconf()},
			struct{ path, perm, content string }{WireGuardScriptPath, "0755", wireGuardScript(c.WireGuard, c.Port)})
		install = append(install, installIfMissing("wg", "wireguard-tools"))
	}
	files = append(files, struct{ path, perm, content string }{ConfigWrittenPath, "0644", configWritten})
	install = append(install, installIfMissing("tinyproxy", "tinyproxy"))

	early := make([]earlyFile, 0, len(units)+len(files))
	for _, u := range units {
		early = append(early, earlyFile{path: u.path, mode: u.mode, content: u.content})
	}
	for _, f := range files {
		early = append(early, earlyFile{path: f.path, mode: parsePerm(f.perm), content: f.content})
	}
	earlyLine, err := earlyFilesLine(early)
	if err != nil {
		return nil, err
	}

	var b bytes.Buffer
	b.WriteString(`#cloud-config
# Rendered by egress-proxies-operator from the Proxy's spec.proxy.
# The next line is the files below (bootcmd's units, write_files' files) as a base64 tar.gz,
# for images that install them before cloud-init runs; cloud-init itself ignores it.
`)
	b.WriteString(earlyLine)
	b.WriteString(`merge_how:
  - name: list
    settings: [append]
  - name: dict
    settings: [no_replace, recurse_list]
bootcmd:
  - |
    mkdir -p ` + path.Dir(TinyproxyDropInPath) + ` ` + path.Dir(LinkRetryScriptPath) + `
`)
	for _, u := range units {
		b.WriteString("    cat >" + u.path + " <<'EOF'\n")
		indent(&b, "    ", u.content)
		b.WriteString("    EOF\n")
		if u.mode != 0o644 {
			b.WriteString(fmt.Sprintf("    chmod %04o %s\n", u.mode, u.path))
		}
	}
	b.WriteString(`    systemctl daemon-reload
    systemctl start --no-block ` + TinyproxyPathUnit + `
    systemctl enable --quiet ` + LinkRetryUnit + `
    systemctl start --no-block ` + LinkRetryUnit + `
write_files:
`)
	for _, f := range files {
		b.WriteString("  - path: " + f.path + "\n    owner: root:root\n    permissions: \"" + f.perm + "\"\n    content: |\n")
		indent(&b, "      ", f.content)
	}
	b.WriteString("runcmd:\n")
	for _, cmd := range install {
		b.WriteString(`  - [sh, -c, "` + cmd + `"]` + "\n")
	}
	b.WriteString("  - [systemctl, start, tinyproxy]\n")
	return b.Bytes(), nil
}

// configWritten is ConfigWrittenPath's content; only the file's existence counts.
const configWritten = "# Written by cloud-init after tinyproxy's configuration and the egress fence.\n"

// indent writes text's lines to b, each after prefix.
func indent(b *bytes.Buffer, prefix, text string) {
	for _, line := range strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n") {
		b.WriteString(prefix + strings.TrimSuffix(line, "\n") + "\n")
	}
}

// installIfMissing installs pkg with apt-get on an image that lacks the command cmd; on
// one that has it (the test image) it does nothing, so no package manager runs. dpkg keeps
// a configuration file cloud-init has written already.
func installIfMissing(cmd, pkg string) string {
	return "command -v " + cmd + " >/dev/null 2>&1 || { apt-get update; DEBIAN_FRONTEND=noninteractive apt-get install -y " +
		"-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold " + pkg + "; }"
}

// UserData is the instance's user-data for c and the user's own cloud-init (spec.cloudInit):
// the rendered cloud-config alone when user is empty, otherwise a MIME multipart document
// with the user's part (or parts) first and the rendered cloud-config last, so that its
// merge rules apply on top of the user's. The boundary is derived from the content, so the
// same inputs give the same bytes (and spec hash).
//
// The user's part keeps its kind, which cloud-init reads from the first line:
//
//	#cloud-config           text/cloud-config
//	#!                      text/x-shellscript
//	#include                text/x-include-url
//	#include-once           text/x-include-once-url
//	#cloud-boothook         text/cloud-boothook
//	#cloud-config-archive   text/cloud-config-archive
//	#part-handler           text/part-handler
//	## template: jinja      text/jinja2
//	Content-Type: or        a MIME document: its parts are taken over as they are
//	MIME-Version:
//
// Anything else (plain text, gzip) is refused: cloud-init would not know what to do with it.
func UserData(c Config, user string) ([]byte, error) {
	rendered, err := CloudConfig(c)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(user) == "" {
		return rendered, nil
	}
	parts, err := userParts(user)
	if err != nil {
		return nil, err
	}
	parts = append(parts, part{header: partHeader("text/cloud-config", "proxy.cfg", rendered), body: rendered})
	return multipartDocument(parts)
}

// ErrUserCloudInit is wrapped by UserData's errors about spec.cloudInit. The messages
// never quote it.
var ErrUserCloudInit = errors.New("spec.cloudInit cannot be combined with spec.proxy")

type part struct {
	header textproto.MIMEHeader
	body   []byte
}

// firstLineTypes maps the first line of a user-data document to its MIME type, longest
// prefix first where one is another's prefix.
var firstLineTypes = []struct{ prefix, ctype string }{
	{"#cloud-config-archive", "text/cloud-config-archive"},
	{"#cloud-config", "text/cloud-config"},
	{"#cloud-boothook", "text/cloud-boothook"},
	{"#include-once", "text/x-include-once-url"},
	{"#include", "text/x-include-url"},
	{"#part-handler", "text/part-handler"},
	{"## template: jinja", "text/jinja2"},
	{"#!", "text/x-shellscript"},
}

func userParts(user string) ([]part, error) {
	if !utf8.ValidString(user) {
		return nil, fmt.Errorf("%w: it is not UTF-8 text (gzip is not supported here)", ErrUserCloudInit)
	}
	first, _, _ := strings.Cut(user, "\n")
	first = strings.TrimRight(first, "\r")
	if hasPrefixFold(first, "content-type:") || hasPrefixFold(first, "mime-version:") {
		return mimeParts(user)
	}
	for _, t := range firstLineTypes {
		if strings.HasPrefix(first, t.prefix) {
			return []part{{header: partHeader(t.ctype, "user-data", []byte(user)), body: []byte(user)}}, nil
		}
	}
	return nil, fmt.Errorf("%w: its first line must say what it is (#cloud-config, #!, #include, #cloud-boothook, ## template: jinja, or a MIME document's Content-Type:)", ErrUserCloudInit)
}

// mimeParts takes over the parts of a user's MIME document, headers and bodies as they are.
func mimeParts(user string) ([]part, error) {
	msg, err := mail.ReadMessage(strings.NewReader(user))
	if err != nil {
		return nil, fmt.Errorf("%w: reading its MIME headers: %w", ErrUserCloudInit, err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		return nil, fmt.Errorf("%w: its Content-Type: %w", ErrUserCloudInit, err)
	}
	if !strings.HasPrefix(mt, "multipart/") {
		body, err := io.ReadAll(msg.Body)
		if err != nil {
			return nil, fmt.Errorf("%w: reading its body: %w", ErrUserCloudInit, err)
		}
		h := textproto.MIMEHeader(msg.Header)
		return []part{{header: h, body: body}}, nil
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	var parts []part
	for {
		p, err := r.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading part %d of its multipart body: %w", ErrUserCloudInit, len(parts)+1, err)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			return nil, fmt.Errorf("%w: reading part %d of its multipart body: %w", ErrUserCloudInit, len(parts)+1, err)
		}
		parts = append(parts, part{header: p.Header, body: body})
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("%w: its multipart body has no parts", ErrUserCloudInit)
	}
	return parts, nil
}

func partHeader(ctype, filename string, body []byte) textproto.MIMEHeader {
	charset, encoding := "us-ascii", "7bit"
	for _, b := range body {
		if b >= 0x80 {
			charset, encoding = "utf-8", "8bit"
			break
		}
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Type", mime.FormatMediaType(ctype, map[string]string{"charset": charset}))
	h.Set("Mime-Version", "1.0")
	h.Set("Content-Transfer-Encoding", encoding)
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filename}))
	return h
}

// multipartDocument writes parts as a multipart/mixed document whose boundary is a hash
// of the parts: stable for the same parts, and (a hash of them) found in none of them.
func multipartDocument(parts []part) ([]byte, error) {
	sum := sha256.New()
	for _, p := range parts {
		sum.Write(p.body)
	}
	boundary := "epo-" + hex.EncodeToString(sum.Sum(nil))[:32]
	var b bytes.Buffer
	b.WriteString("Content-Type: " + mime.FormatMediaType("multipart/mixed", map[string]string{"boundary": boundary}) + "\r\n")
	b.WriteString("MIME-Version: 1.0\r\n\r\n")
	w := multipart.NewWriter(&b)
	if err := w.SetBoundary(boundary); err != nil {
		return nil, fmt.Errorf("multipart boundary %s: %w", boundary, err)
	}
	for _, p := range parts {
		pw, err := w.CreatePart(p.header)
		if err != nil {
			return nil, fmt.Errorf("writing a user-data part: %w", err)
		}
		if _, err := pw.Write(p.body); err != nil {
			return nil, fmt.Errorf("writing a user-data part: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("closing the user-data multipart: %w", err)
	}
	return b.Bytes(), nil
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
