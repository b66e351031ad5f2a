package proxyconfig

import _ "embed"

const (
	// LinkRetryUnit watches the en* links for the first five minutes of a boot and has
	// systemd-networkd configure again one it marked failed (linkRetryScript). The test
	// image has it enabled; the rendered cloud-config installs and starts it on any image.
	LinkRetryUnit = "egress-proxies-operator-link-retry.service"
	// LinkRetryUnitPath is where the rendered cloud-config (and the test image) write it.
	LinkRetryUnitPath = "/etc/systemd/system/" + LinkRetryUnit
	// LinkRetryScriptPath is the unit's ExecStart.
	LinkRetryScriptPath = "/usr/local/libexec/egress-proxies-operator-link-retry"
)

// The unit and its script, one copy for the rendered cloud-config and for the test image
// (hack/lib/guest-image-customize.sh installs these files).
var (
	//go:embed files/link-retry.service
	linkRetryUnit string
	//go:embed files/link-retry.sh
	linkRetryScript string
)
