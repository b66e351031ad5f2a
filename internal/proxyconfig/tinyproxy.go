package proxyconfig

import (
	"fmt"
	"net/netip"
	"strings"
)

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
	if c.Credentials != nil {
		fmt.Fprintf(&b, "BasicAuth %s %s\n", c.Credentials.Username, c.Credentials.Password)
	}
	return b.String(), allowed, nil
}
