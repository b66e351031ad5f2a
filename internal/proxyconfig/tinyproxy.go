package proxyconfig

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
)

// renderingVariant, when set, adds a comment line to tinyproxy's configuration: a
// rendering that means the same but differs byte for byte, as a later operator release's
// may. Empty in every build; see SetRenderingVariant.
var renderingVariant atomic.Pointer[string]

// SetRenderingVariant makes every rendering from now on differ from today's by a comment
// naming variant (none for ""), as if the operator had been upgraded to a release whose
// rendering changed; it returns a function restoring the previous variant. It exists for
// tests of what an upgrade does to running instances; the manager never calls it.
func SetRenderingVariant(variant string) (restore func()) {
	prev := renderingVariant.Swap(&variant)
	return func() { renderingVariant.Store(prev) }
}

// TinyproxyConfPath is where the rendered cloud-config writes tinyproxy's configuration
// (root:root 0600: tinyproxy reads it as root, before it drops to its user).
const TinyproxyConfPath = "/etc/tinyproxy/tinyproxy.conf"

// tinyproxyConf is tinyproxy.conf for c, and c's allowed destinations; c must be valid. Loopback is always allowed
// (a check from the guest itself); the Via header is off so the target sees no proxy;
// CONNECT goes to port 443 only, so the proxy cannot tunnel to mail or SSH servers.
func tinyproxyConf(c Config) (string, []netip.Prefix, error) {
	nets, allowed, err := c.validate()
	if err != nil {
		return "", nil, err
	}
	var b strings.Builder
	b.WriteString("# Rendered by egress-proxies-operator from the Proxy's spec; edits are lost on the next instance.\n")
	b.WriteString("User tinyproxy\nGroup tinyproxy\n")
	fmt.Fprintf(&b, "Port %d\n", c.Port)
	b.WriteString(`Timeout 600
DefaultErrorFile "/usr/share/tinyproxy/default.html"
StatFile "/usr/share/tinyproxy/stats.html"
Syslog On
LogLevel Notice
PidFile "/run/tinyproxy/tinyproxy.pid"
MaxClients 100
DisableViaHeader Yes
ConnectPort 443
Allow 127.0.0.1
Allow ::1
`)
	for _, n := range nets {
		fmt.Fprintf(&b, "Allow %s\n", n)
	}
	if v := renderingVariant.Load(); v != nil && *v != "" {
		fmt.Fprintf(&b, "# rendering variant %s\n", *v)
	}
	if c.Credentials != nil {
		fmt.Fprintf(&b, "BasicAuth %s %s\n", c.Credentials.Username, c.Credentials.Password)
	}
	return b.String(), allowed, nil
}
