package kvm2

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"mime/multipart"
	"net/textproto"

	"github.com/kdomanski/iso9660"
)

// seedLabel is the volume label cloud-init's NoCloud datasource looks for.
const seedLabel = "cidata"

// guestAgentScript installs and starts qemu-guest-agent, which is how the operator
// learns a VM's address. It travels as a vendor-data shell script rather than a
// cloud-config on purpose: cloud-init merges a vendor-data cloud-config under the
// user-data, keeping the user-data's value of every top-level key both define, so a
// user-data with its own packages: would silently drop the agent. Scripts are not merged.
//
// It is idempotent (an installed agent is not reinstalled, a running one is left alone),
// works with apt-get, dnf, yum, zypper and apk, and with systemd or OpenRC.
const guestAgentScript = `#!/bin/sh
# Installs and starts qemu-guest-agent so the hypervisor can report this VM's addresses.
exec >>/var/log/cloud-init-output.log 2>&1
echo "qemu-guest-agent bootstrap: start"

have() { command -v "$1" >/dev/null 2>&1; }

if have qemu-ga || [ -x /usr/bin/qemu-ga ] || [ -x /usr/sbin/qemu-ga ]; then
	echo "qemu-guest-agent bootstrap: agent already installed"
elif have apt-get; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q --no-install-recommends qemu-guest-agent ||
		{ apt-get update -q && apt-get install -y -q --no-install-recommends qemu-guest-agent; }
elif have dnf; then
	dnf install -y qemu-guest-agent
elif have yum; then
	yum install -y qemu-guest-agent
elif have zypper; then
	zypper --non-interactive install qemu-guest-agent
elif have apk; then
	apk add --no-cache qemu-guest-agent
else
	echo "qemu-guest-agent bootstrap: no known package manager; giving up"
	exit 0
fi

if have systemctl; then
	systemctl enable qemu-guest-agent || true
	systemctl start qemu-guest-agent
elif have rc-service; then
	rc-update add qemu-guest-agent default || true
	rc-service qemu-guest-agent start
else
	echo "qemu-guest-agent bootstrap: neither systemctl nor rc-service found"
fi
echo "qemu-guest-agent bootstrap: done"
`

// vendorData assembles the seed's vendor-data: the guest-agent script, the configured
// vendorData, both as a MIME multipart, or nothing.
func vendorData(configured string, installAgent bool) []byte {
	switch {
	case !installAgent:
		return []byte(configured)
	case configured == "":
		return []byte(guestAgentScript)
	}
	// The boundary is derived from the content, so the same inputs give the same bytes
	// and the boundary cannot occur in either part.
	sum := sha256.Sum256([]byte(configured + "\x00" + guestAgentScript))
	boundary := "kvm2-" + hex.EncodeToString(sum[:16])

	var buf bytes.Buffer
	// cloud-init recognises a multipart only when MIME-Version is the first header.
	fmt.Fprintf(&buf, "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=%q\r\n\r\n", boundary)
	w := multipart.NewWriter(&buf)
	_ = w.SetBoundary(boundary) // valid by construction
	part := func(ctype, filename, body string) {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", ctype)
		h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", filename))
		pw, _ := w.CreatePart(h) // writes to a bytes.Buffer: cannot fail
		_, _ = pw.Write([]byte(body))
	}
	// text/plain lets cloud-init detect the document's own type from its first line.
	part(`text/plain; charset="utf-8"`, "vendor-data", configured)
	part(`text/x-shellscript; charset="utf-8"`, "qemu-guest-agent.sh", guestAgentScript)
	_ = w.Close()
	return buf.Bytes()
}

// metaData is the seed's meta-data. A stable instance-id keeps cloud-init from taking a
// reboot for a new instance.
func metaData(name string) []byte {
	return []byte("instance-id: " + name + "\nlocal-hostname: " + name + "\n")
}

// buildSeedISO builds the NoCloud seed for VM name: an ISO 9660 image labelled cidata
// holding user-data (userData byte for byte, never parsed), meta-data and vendor-data.
// The files are staged in a temporary directory that is removed before it returns.
func buildSeedISO(name string, userData, vendor []byte) ([]byte, error) {
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("staging seed iso for %s: %w", name, err)
	}
	defer w.Cleanup() //nolint:errcheck // best effort; the happy path cleans up below
	files := []struct {
		name string
		data []byte
	}{
		{"user-data", userData},
		{"meta-data", metaData(name)},
		{"vendor-data", vendor},
	}
	for _, f := range files {
		if err := w.AddFile(bytes.NewReader(f.data), f.name); err != nil {
			return nil, fmt.Errorf("staging %s of seed iso for %s: %w", f.name, name, err)
		}
	}
	var out bytes.Buffer
	if err := w.WriteTo(&out, seedLabel); err != nil {
		return nil, fmt.Errorf("writing seed iso for %s: %w", name, err)
	}
	if err := w.Cleanup(); err != nil {
		return nil, fmt.Errorf("removing the staging directory of seed iso for %s: %w", name, err)
	}
	return out.Bytes(), nil
}
