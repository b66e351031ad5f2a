package proxyconfig

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The guest egress fence: nftables rules, loaded before tinyproxy starts, that refuse
// every connection the proxy's user (tinyproxy) makes to a network that is not the
// internet's: loopback, "this network" (0.0.0.0/8), RFC 1918, shared address space
// (100.64.0.0/10), link-local, unique-local, multicast and reserved ranges, the metadata
// addresses, the guest's own addresses and subnets, for IPv4 and IPv6. tinyproxy resolves
// the names it is asked for, so a crawler's own checks cannot stand in for this.
//
// spec.proxy.allowedDestinations open exceptions, except for the metadata addresses,
// which stay refused. DNS (port 53) to the resolvers in the guest's /etc/resolv.conf
// stays open: tinyproxy resolves names as that user.
const (
	// FenceRulesetPath is the nftables ruleset the rendered cloud-config writes.
	FenceRulesetPath = "/etc/egress-proxies-operator/fence.nft"
	// FenceScriptPath loads the ruleset and adds the guest's subnets and resolvers: the
	// ExecStartPre of tinyproxy.service, so tinyproxy does not start without the fence.
	FenceScriptPath = "/etc/egress-proxies-operator/fence.sh"
	// TinyproxyDropInPath is the systemd drop-in that puts FenceScriptPath before tinyproxy.
	TinyproxyDropInPath = "/etc/systemd/system/tinyproxy.service.d/50-egress-fence.conf"
	// FenceRetryUnit is tinyproxy.service's OnFailure= unit: after a start that failed
	// because the guest had no address yet, it waits for one and starts tinyproxy again.
	FenceRetryUnit = "egress-proxies-operator-fence-retry.service"
	// FenceRetryUnitPath is where the rendered cloud-config writes FenceRetryUnit.
	FenceRetryUnitPath = "/etc/systemd/system/" + FenceRetryUnit
	// TinyproxyPathUnit starts tinyproxy.service as soon as ConfigWrittenPath exists: the
	// moment cloud-init has written the last of tinyproxy's files, early in its network
	// stage, instead of after that whole stage (SSH host keys and the rest), which
	// sysinit.target and every ordinary service wait for.
	TinyproxyPathUnit = "egress-proxies-operator-tinyproxy.path"
	// TinyproxyPathUnitPath is where the rendered cloud-config writes TinyproxyPathUnit.
	TinyproxyPathUnitPath = "/etc/systemd/system/" + TinyproxyPathUnit
	// TinyproxyStartUnit is the oneshot TinyproxyPathUnit starts: it starts
	// tinyproxy.service once and stays active, so the path unit does not start tinyproxy
	// again after a failed start.
	TinyproxyStartUnit = "egress-proxies-operator-tinyproxy-start.service"
	// TinyproxyStartUnitPath is where the rendered cloud-config writes TinyproxyStartUnit.
	TinyproxyStartUnitPath = "/etc/systemd/system/" + TinyproxyStartUnit
	// ConfigWrittenPath is the last file the rendered write_files writes, after
	// tinyproxy's configuration, the fence and (with WireGuard egress) the tunnel's: its
	// existence says all of them are complete. TinyproxyPathUnit waits for it, and
	// tinyproxy.service does not start without it.
	ConfigWrittenPath = "/etc/egress-proxies-operator/written"
	// FenceNoAddressMarker is the file FenceScriptPath leaves when it gave up waiting for
	// the guest's address (and removes at every start): FenceRetryUnit's condition.
	FenceNoAddressMarker = "/run/egress-proxies-operator/fence-no-address"
	// fenceNoAddressExit is FenceScriptPath's exit status when the guest has no address
	// (EX_TEMPFAIL): the one failure that comes right by waiting.
	fenceNoAddressExit = 75
	// FenceTable is the nftables table of the fence.
	FenceTable = "inet egress_proxies_operator"
	// FenceWireGuardEndpoints4 and FenceWireGuardEndpoints6 are the fence's sets of
	// WireGuard endpoints (address . UDP port) the proxy's user may send to. The guest
	// kernel sends the tunnel's encrypted packets with the socket of the connection inside
	// them still attached, so to the fence they are the proxy user's UDP to the endpoint,
	// refused when the endpoint is a private address (an exit on the LAN). The WireGuard
	// script adds the endpoint wg resolved, after the fence is loaded.
	FenceWireGuardEndpoints4 = "wg_endpoints4"
	FenceWireGuardEndpoints6 = "wg_endpoints6"
	// proxyUser is the user tinyproxy runs as (its configuration's User line).
	proxyUser = "tinyproxy"
)

// MetadataAddrs are the cloud metadata servers: refused to the proxy's user whatever
// spec.proxy.allowedDestinations say, and never fetched by the kvm2 image cache whatever
// its prefix list allows (imagecache.RefusedAddr).
var MetadataAddrs = []string{
	"169.254.169.254", // GCE, AWS, Azure, OpenStack
	"100.100.100.200", // Alibaba Cloud
	"fd00:ec2::254",   // AWS over IPv6
	"fd20:ce::254",    // GCE over IPv6
}

// FencedNetworks are the networks the fence refuses unless allowedDestinations open them
// (the guest's own subnets and addresses come on top, found when tinyproxy starts).
var FencedNetworks = []string{
	"0.0.0.0/8",      // "this network": 0.0.0.0 reaches the guest itself
	"10.0.0.0/8",     // RFC 1918
	"100.64.0.0/10",  // shared address space (CGNAT)
	"127.0.0.0/8",    // loopback
	"169.254.0.0/16", // link-local, and the metadata servers
	"172.16.0.0/12",  // RFC 1918
	"192.168.0.0/16", // RFC 1918
	"224.0.0.0/4",    // multicast
	"240.0.0.0/4",    // reserved, and the broadcast address
	"::/128",         // unspecified
	"::1/128",        // loopback
	"::ffff:0:0/96",  // IPv4-mapped: reaches the IPv4 networks above
	"64:ff9b::/96",   // NAT64: may reach private IPv4 networks through a translator
	"64:ff9b:1::/48", // local-use NAT64
	"fc00::/7",       // unique-local
	"fe80::/10",      // link-local
	"fec0::/10",      // site-local (deprecated)
	"ff00::/8",       // multicast
}

// fenceRuleset is the nftables ruleset for the allowed destinations (networks, host bits
// cleared). Loading it replaces the table atomically; the script then fills own4/own6
// and resolvers4/resolvers6.
//
// Only a TCP connection's first packet (SYN without ACK) is judged: the proxy's
// answers to its clients, who are on private networks as often as not, pass. UDP and
// everything else from the proxy's user is judged per packet (tinyproxy sends UDP only
// to resolve names). A refused TCP connection gets a reset (tinyproxy answers its client
// 500 "Unable to connect"), anything else an ICMP administratively-prohibited.
func fenceRuleset(allowed []netip.Prefix) string {
	var v4, v6 []string
	for _, p := range allowed {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	var fenced4, fenced6 []string
	for _, n := range FencedNetworks {
		if strings.Contains(n, ":") {
			fenced6 = append(fenced6, n)
		} else {
			fenced4 = append(fenced4, n)
		}
	}
	var meta4, meta6 []string
	for _, a := range MetadataAddrs {
		if strings.Contains(a, ":") {
			meta6 = append(meta6, a)
		} else {
			meta4 = append(meta4, a)
		}
	}
	set := func(name, typ string, interval bool, elems []string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", name, typ)
		if interval {
			b.WriteString("\t\tflags interval\n\t\tauto-merge\n")
		}
		if len(elems) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(elems, ", "))
		}
		b.WriteString("\t}\n")
		return b.String()
	}
	var b strings.Builder
	b.WriteString("# Rendered by egress-proxies-operator from the Proxy's spec.proxy: the connections the\n")
	b.WriteString("# proxy's user may not make. Loaded by " + FenceScriptPath + " before tinyproxy starts.\n")
	b.WriteString("table " + FenceTable + "\ndelete table " + FenceTable + "\n")
	b.WriteString("table " + FenceTable + " {\n")
	b.WriteString(set("metadata4", "ipv4_addr", false, meta4))
	b.WriteString(set("metadata6", "ipv6_addr", false, meta6))
	b.WriteString(set("resolvers4", "ipv4_addr", false, nil))
	b.WriteString(set("resolvers6", "ipv6_addr", false, nil))
	b.WriteString(set("allowed4", "ipv4_addr", true, v4))
	b.WriteString(set("allowed6", "ipv6_addr", true, v6))
	b.WriteString(set("fenced4", "ipv4_addr", true, fenced4))
	b.WriteString(set("fenced6", "ipv6_addr", true, fenced6))
	b.WriteString(set("own4", "ipv4_addr", true, nil))
	b.WriteString(set("own6", "ipv6_addr", true, nil))
	b.WriteString(set(FenceWireGuardEndpoints4, "ipv4_addr . inet_service", false, nil))
	b.WriteString(set(FenceWireGuardEndpoints6, "ipv6_addr . inet_service", false, nil))
	b.WriteString(`	chain output {
		type filter hook output priority filter; policy accept;
		meta skuid "` + proxyUser + `" jump proxy_user
	}
	chain proxy_user {
		tcp flags & (syn | ack) != syn accept
		meta l4proto { tcp, udp } th dport 53 ip daddr @resolvers4 accept
		meta l4proto { tcp, udp } th dport 53 ip6 daddr @resolvers6 accept
		ip daddr @metadata4 goto refuse
		ip6 daddr @metadata6 goto refuse
		ip daddr . udp dport @` + FenceWireGuardEndpoints4 + ` accept
		ip6 daddr . udp dport @` + FenceWireGuardEndpoints6 + ` accept
		ip daddr @allowed4 accept
		ip6 daddr @allowed6 accept
		fib daddr type local goto refuse
		ip daddr @fenced4 goto refuse
		ip6 daddr @fenced6 goto refuse
		ip daddr @own4 goto refuse
		ip6 daddr @own6 goto refuse
	}
	chain refuse {
		meta l4proto tcp reject with tcp reset
		reject with icmpx admin-prohibited
	}
}
`)
	return b.String()
}

// fenceScript is FenceScriptPath: tinyproxy.service's ExecStartPre. It waits (up to 60 s)
// for the guest's first global address, then loads the ruleset, the guest's on-link
// subnets (the routes of its main table without a gateway, IPv4 and IPv6, whatever their
// proto: an on-link prefix from a router advertisement is proto kernel when the kernel
// took it, proto ra when systemd-networkd did) and its resolvers in one nft batch. Any failure stops tinyproxy from starting.
// Subnets the guest gets later are not added until tinyproxy restarts (they are private
// ranges in most networks, and so refused anyway).
//
// Without an address after 60 s it leaves FenceNoAddressMarker and exits
// fenceNoAddressExit; tinyproxy fails, and its OnFailure= unit (FenceRetryUnit) runs the
// script with the argument "retry": wait for an address however long it takes, then
// start tinyproxy again, which loads the fence first like every start. A late DHCP lease
// so delays the proxy but does not leave it stopped for good, and tinyproxy never runs
// without the fence. Any other failure (no nft, a ruleset the kernel refuses) leaves no
// marker, so nothing retries it and tinyproxy stays stopped.
var fenceScript = `#!/bin/sh
# Rendered by egress-proxies-operator: the egress fence, loaded before tinyproxy starts
# (ExecStartPre of tinyproxy.service); tinyproxy does not start when this fails. One nft
# call loads the ruleset with the guest's subnets and resolvers as one atomic batch: the
# table is there whole or not at all (and nft is slow to start on an emulated guest).
# With the argument "retry" (` + FenceRetryUnit + `, after a start that found no
# address): wait for the guest's address, however long, then start tinyproxy again.
set -eu
table="` + FenceTable + `"
marker="` + FenceNoAddressMarker + `"
has_address() { [ -n "$(ip -o addr show scope global)" ]; }
if [ "${1:-}" = retry ]; then
  until has_address; do sleep 2; done
  echo "egress fence: the guest has an address now; starting tinyproxy again"
  exec systemctl --no-block start tinyproxy.service
fi
rm -f "$marker"
i=0
until has_address; do
  i=$((i + 1))
  if [ "$i" -gt 120 ]; then
    mkdir -p "${marker%/*}"
    : >"$marker"
    echo "egress fence: the guest has no global address after 60 s; tinyproxy stays stopped until it has one" >&2
    exit ` + strconv.Itoa(fenceNoAddressExit) + `
  fi
  sleep 0.5
done
batch=/run/egress-proxies-operator-fence.nft
addr='^[0-9A-Fa-f:.]+(/[0-9]+)?$'
{
  cat ` + FenceRulesetPath + `
  # The guest's subnets: every route of the main table without a gateway, whoever put it
  # there (the kernel, DHCP, router advertisements: networkd's on-link prefixes are proto ra).
  for fam in 4 6; do
    ip -o -"$fam" route show table main | awk -v re="$addr" -v set="$table own$fam" '$1 ~ re && !/ via / { print "add element " set " { " $1 " }" }'
  done
  if [ -r /etc/resolv.conf ]; then
    awk -v t="$table" '$1 == "nameserver" && $2 !~ /%/ { print "add element " t " resolvers" ($2 ~ /:/ ? "6" : "4") " { " $2 " }" }' /etc/resolv.conf
  fi
} >"$batch"
nft -f "$batch"
echo "egress fence loaded: $(grep -c '^add element' "$batch") subnets and resolvers besides the fixed ranges"
`

// tinyproxyDropIn is TinyproxyDropInPath: tinyproxy starts only once cloud-init has
// written its configuration and the fence (ConfigWrittenPath), and only once the fence (and,
// with WireGuard egress, the tunnel's routing) is loaded; when it fails, FenceRetryUnit
// looks at why.
//
// DefaultDependencies=no takes away the implicit After=sysinit.target: cloud-init's network
// stage (cloud-init.service) is ordered before sysinit.target, so an ordinary service
// waits for all of that stage, whose slow modules (SSH host keys under emulation) come after
// write_files. Ordered after the local file systems and tmpfiles only, it is started by
// TinyproxyPathUnit the moment the files are there. Not after network.target either: that
// target is ordered after network-pre.target, which cloud-init's first stage
// (cloud-init-local.service, a Python start of tens of seconds under emulation) holds back,
// and tinyproxy needs no network to listen (the fence script waits for the address). The start job systemd
// queued at boot for an enabled tinyproxy runs at once after bootcmd's daemon-reload and is
// skipped by the condition (not failed), so the image's tinyproxy never starts without the
// rendered configuration.
func tinyproxyDropIn(wireguard bool) string {
	s := `# Rendered by egress-proxies-operator: tinyproxy starts behind the egress fence, as soon
# as cloud-init has written its configuration, or not at all.
[Unit]
DefaultDependencies=no
After=local-fs.target systemd-tmpfiles-setup.service
Conflicts=shutdown.target
Before=shutdown.target
ConditionPathExists=` + ConfigWrittenPath + `
OnFailure=` + FenceRetryUnit + `
[Service]
ExecStartPre=/bin/sh ` + FenceScriptPath + "\n"
	if wireguard {
		s += "ExecStartPre=/bin/sh " + WireGuardScriptPath + "\n"
	}
	return s + `# nft takes tens of seconds on a busy emulated guest: more than the default 90 s in all.
TimeoutStartSec=5min
`
}

// tinyproxyPathUnit is TinyproxyPathUnitPath, started by bootcmd (or the test image's seed
// unit): once ConfigWrittenPath exists (at once when it does already, on a later boot) it
// starts TinyproxyStartUnit, which starts tinyproxy.service. Without default dependencies
// it is not ordered after sysinit.target either.
//
// It does not start tinyproxy.service itself: a path unit with PathExists= triggers its
// unit again each time that unit stops while the path exists, so a tinyproxy whose fence
// cannot load would be started over and over for the guest's whole life (the e2e tier's
// fail-closed guest was found "activating" minutes later). The start unit stays active
// after its one run (RemainAfterExit=), so the path unit triggers once per boot.
const tinyproxyPathUnit = `# Rendered by egress-proxies-operator: start tinyproxy as soon as its configuration and
# the egress fence are written.
[Unit]
Description=Start tinyproxy once its rendered configuration is written
DefaultDependencies=no
Conflicts=shutdown.target
Before=shutdown.target
[Path]
PathExists=` + ConfigWrittenPath + `
Unit=` + TinyproxyStartUnit + `
`

// tinyproxyStartUnit is TinyproxyStartUnitPath: tinyproxy's one start of the boot, asked
// for by TinyproxyPathUnit. A tinyproxy that fails to start is not started again by it;
// only FenceRetryUnit retries, and only a start that found no address.
const tinyproxyStartUnit = `# Rendered by egress-proxies-operator: start tinyproxy once per boot, when its path unit
# sees the rendered files; staying active keeps the path unit from starting it again.
[Unit]
Description=Start tinyproxy once per boot behind the egress fence
DefaultDependencies=no
Conflicts=shutdown.target
Before=shutdown.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/systemctl --no-block start tinyproxy.service
`

// fenceRetryUnit is FenceRetryUnitPath, started by tinyproxy's OnFailure=. It runs only
// after a start that found no address (FenceNoAddressMarker); then it waits for one and
// starts tinyproxy, so a guest whose DHCP lease comes late still serves, behind the fence.
const fenceRetryUnit = `# Rendered by egress-proxies-operator: after tinyproxy failed to start because the guest
# had no address yet, wait for one and start tinyproxy again (behind the egress fence).
[Unit]
Description=Start tinyproxy behind the egress fence once the guest has an address
ConditionPathExists=` + FenceNoAddressMarker + `
[Service]
ExecStart=/bin/sh ` + FenceScriptPath + ` retry
`
