package proxyconfig

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The keys of a WireGuard Secret.
const (
	// SecretKeyWireGuard holds one configuration in wg-quick form.
	SecretKeyWireGuard = "wg0.conf"
	// SecretKeyEgressIP optionally holds the exit's public address, which the probe
	// verifies.
	SecretKeyEgressIP = "egressIP"
)

// ErrWireGuardSecret is wrapped by every error about a WireGuard Secret the user fixes:
// missing, not opted in, without the key wg0.conf, or with a configuration that does
// not parse. The messages name the Secret and the key or line, never a key's value.
var ErrWireGuardSecret = errors.New("wireguard secret unusable")

// WireGuard is one parsed WireGuard configuration: the guest's interface and its one
// peer, the exit.
type WireGuard struct {
	// PrivateKey is the interface's private key, base64. Never log it.
	PrivateKey string
	// Addresses are the interface's addresses (Address), with their prefix lengths.
	Addresses []netip.Prefix
	// MTU, when not 0, is the interface's MTU.
	MTU int
	// Peer is the exit.
	Peer WireGuardPeer
	// EgressIP, when valid, is the exit's public address as the VPN provider states it.
	EgressIP netip.Addr
}

// WireGuardPeer is the [Peer] section.
type WireGuardPeer struct {
	PublicKey    string
	PresharedKey string // never log it
	Endpoint     string // host:port
	AllowedIPs   []netip.Prefix
	// PersistentKeepalive, in seconds; 0 is off.
	PersistentKeepalive int
}

// wgQuickOnly are [Interface] keys of wg-quick the rendering ignores: the operator does
// its own addressing and routing (only the proxy's traffic takes the tunnel) and leaves
// the guest's DNS as it is.
var wgQuickOnly = map[string]bool{
	"dns": true, "table": true, "preup": true, "postup": true, "predown": true, "postdown": true,
	"saveconfig": true, "fwmark": true, "listenport": true,
}

// ParseWireGuard parses a configuration in wg-quick form. Its errors wrap
// ErrWireGuardSecret, name the line (1-based) and the key, and never quote a key.
func ParseWireGuard(text string) (*WireGuard, error) {
	wg := &WireGuard{}
	section, peers, iface := "", 0, false
	bad := func(n int, format string, args ...any) error {
		return fmt.Errorf("%w: line %d: %s", ErrWireGuardSecret, n, fmt.Sprintf(format, args...))
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "[") {
			switch strings.ToLower(line) {
			case "[interface]":
				if iface {
					return nil, bad(n, "a second [Interface] section; a configuration has one")
				}
				section, iface = "interface", true
			case "[peer]":
				peers++
				if peers > 1 {
					return nil, bad(n, "a second [Peer] section; the configuration must have exactly one peer, the exit")
				}
				section = "peer"
			default:
				return nil, bad(n, "unknown section %s; want [Interface] or [Peer]", line)
			}
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, bad(n, "want Key = Value or a [Section]")
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if err := wg.set(section, key, value); err != nil {
			return nil, bad(n, "%s: %v", key, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: reading it: %w", ErrWireGuardSecret, err)
	}
	return wg, wg.complete(iface, peers)
}

func (wg *WireGuard) set(section, key, value string) error {
	k := strings.ToLower(key)
	switch section {
	case "interface":
		switch {
		case k == "privatekey":
			if !isKey(value) {
				return errors.New("not a WireGuard key (32 bytes in base64, 44 characters)")
			}
			wg.PrivateKey = value
		case k == "address":
			ps, err := prefixes(value, true)
			if err != nil {
				return err
			}
			wg.Addresses = append(wg.Addresses, ps...)
		case k == "mtu":
			m, err := strconv.Atoi(value)
			if err != nil || m < 1280 || m > 9000 {
				return fmt.Errorf("%q is not an MTU from 1280 to 9000", value)
			}
			wg.MTU = m
		case wgQuickOnly[k]:
		default:
			return errors.New("unknown [Interface] key")
		}
	case "peer":
		p := &wg.Peer
		switch k {
		case "publickey":
			if !isKey(value) {
				return errors.New("not a WireGuard key (32 bytes in base64, 44 characters)")
			}
			p.PublicKey = value
		case "presharedkey":
			if !isKey(value) {
				return errors.New("not a WireGuard key (32 bytes in base64, 44 characters)")
			}
			p.PresharedKey = value
		case "endpoint":
			host, port, err := net.SplitHostPort(value)
			if err != nil || host == "" || strings.ContainsAny(host, " \t\"'`$\\;") {
				return fmt.Errorf("%q is not host:port", value)
			}
			if pn, err := strconv.Atoi(port); err != nil || pn < 1 || pn > 65535 {
				return fmt.Errorf("%q has no port from 1 to 65535", value)
			}
			p.Endpoint = value
		case "allowedips":
			ps, err := prefixes(value, false)
			if err != nil {
				return err
			}
			p.AllowedIPs = append(p.AllowedIPs, ps...)
		case "persistentkeepalive":
			if value == "off" {
				return nil
			}
			s, err := strconv.Atoi(value)
			if err != nil || s < 0 || s > 65535 {
				return fmt.Errorf("%q is not a number of seconds", value)
			}
			p.PersistentKeepalive = s
		default:
			return errors.New("unknown [Peer] key")
		}
	default:
		return errors.New("outside a section; the configuration starts with [Interface]")
	}
	return nil
}

// complete checks what every configuration must have.
func (wg *WireGuard) complete(iface bool, peers int) error {
	missing := func(what string) error {
		return fmt.Errorf("%w: %s", ErrWireGuardSecret, what)
	}
	switch {
	case !iface:
		return missing("no [Interface] section")
	case wg.PrivateKey == "":
		return missing("[Interface] has no PrivateKey")
	case len(wg.Addresses) == 0:
		return missing("[Interface] has no Address")
	case peers == 0:
		return missing("no [Peer] section; the configuration must have exactly one peer, the exit")
	case wg.Peer.PublicKey == "":
		return missing("[Peer] has no PublicKey")
	case wg.Peer.Endpoint == "":
		return missing("[Peer] has no Endpoint")
	}
	for _, p := range wg.Peer.AllowedIPs {
		if p.Bits() == 0 && p.Addr().Is4() {
			return nil
		}
	}
	return missing("[Peer] AllowedIPs lacks 0.0.0.0/0 (and ::/0 for IPv6): the proxy's traffic goes to every address through the exit")
}

func isKey(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// prefixes parses a comma-separated list of CIDRs; hosts keeps the host bits (an
// interface address), otherwise they are cleared.
func prefixes(value string, hosts bool) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(value, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not an address or a network in CIDR notation", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !hosts {
			p = p.Masked()
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

// setconf is the configuration `wg setconf` takes: the keys of wg(8) alone.
func (wg *WireGuard) setconf() string {
	var b strings.Builder
	b.WriteString("[Interface]\nPrivateKey = " + wg.PrivateKey + "\n[Peer]\nPublicKey = " + wg.Peer.PublicKey + "\n")
	if wg.Peer.PresharedKey != "" {
		b.WriteString("PresharedKey = " + wg.Peer.PresharedKey + "\n")
	}
	b.WriteString("Endpoint = " + wg.Peer.Endpoint + "\n")
	ips := make([]string, len(wg.Peer.AllowedIPs))
	for i, p := range wg.Peer.AllowedIPs {
		ips[i] = p.String()
	}
	b.WriteString("AllowedIPs = " + strings.Join(ips, ", ") + "\n")
	if wg.Peer.PersistentKeepalive > 0 {
		fmt.Fprintf(&b, "PersistentKeepalive = %d\n", wg.Peer.PersistentKeepalive)
	}
	return b.String()
}

// redacted is wg with its private and preshared keys replaced by their SHA-256: what a
// hash may cover (a 32-byte random key cannot be guessed from its digest).
func (wg *WireGuard) redacted() *WireGuard {
	r := *wg
	r.PrivateKey = keyDigest(wg.PrivateKey)
	if r.Peer.PresharedKey != "" {
		r.Peer.PresharedKey = keyDigest(wg.Peer.PresharedKey)
	}
	return &r
}

func keyDigest(k string) string {
	sum := sha256.Sum256([]byte("egress-proxies-operator wireguard key\x00" + k))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Digest is a digest of the whole configuration and the stated egress address: what the
// Proxy's intent hash covers, so that an edited Secret rebuilds the instance.
func (wg *WireGuard) Digest() string {
	r := wg.redacted()
	sum := sha256.Sum256([]byte(r.setconf() + fmt.Sprintf("addresses %v mtu %d egress %s", r.Addresses, r.MTU, r.EgressIP)))
	return hex.EncodeToString(sum[:16])
}

// The guest side of the tunnel.
const (
	// WireGuardConfPath is the wg(8) configuration the rendered cloud-config writes
	// (root:root 0600: it holds the private key).
	WireGuardConfPath = "/etc/egress-proxies-operator/wg.conf"
	// WireGuardScriptPath brings the tunnel and the proxy's policy routing up: an
	// ExecStartPre of tinyproxy.service after the fence, so tinyproxy does not start
	// without them.
	WireGuardScriptPath = "/etc/egress-proxies-operator/wireguard.sh"
	// WireGuardInterface is the tunnel's interface.
	WireGuardInterface = "epo-wg0"
	// WireGuardTable is the routing table of the proxy user's traffic: a default route
	// through the tunnel, and under it an unreachable default.
	WireGuardTable = 51820
	// wireGuardRulePriority is the first of the policy rules' priorities; the rule
	// sending the proxy user's traffic to WireGuardTable is the last, at +9.
	wireGuardRulePriority = 10900
)

// wireGuardScript is WireGuardScriptPath for wg and the proxy's port. It sets up the
// routing that makes the proxy fail-closed before the tunnel exists: for IPv4 and IPv6,
//
//	priority 10900: TCP from the proxy's port      -> main (answers to its clients and probes)
//	priority 10901: to each resolver of resolv.conf -> main (the proxy's DNS)
//	priority 10909: uid of the proxy user          -> table 51820
//	table 51820: default dev epo-wg0 metric 10, unreachable default metric 100
//
// so the proxy user's own connections go through the tunnel or nowhere: when the
// interface is gone its route goes with it and the unreachable default answers, and when
// the exit does not answer the packets die in the tunnel. Everything else on the guest
// (the agent, DHCP, the tunnel's own UDP packets, which the kernel sends) keeps the main
// table. Run again (tinyproxy restarted), it builds everything afresh.
func wireGuardScript(wg *WireGuard, port int32) string {
	var b strings.Builder
	fmt.Fprintf(&b, `#!/bin/sh
# Rendered by egress-proxies-operator from the Proxy's spec.proxy.egress.wireguard: the
# proxy user's own connections leave through a WireGuard tunnel or not at all (an
# unreachable default under the tunnel's route in their table). An ExecStartPre of
# tinyproxy.service: tinyproxy does not start when this fails.
set -eu
dev=%s
table=%d
prio=%d
uid=$(id -u %s)
for fam in -4 -6; do
  if [ "$fam" = -6 ] && [ ! -d /proc/sys/net/ipv6 ]; then continue; fi
  for p in $(seq "$prio" $((prio + 9))); do
    while ip "$fam" rule del priority "$p" 2>/dev/null; do :; done
  done
  ip "$fam" route flush table "$table" 2>/dev/null || true
  ip "$fam" route add unreachable default table "$table" metric 100
  ip "$fam" rule add priority "$prio" ipproto tcp sport %d lookup main
  ip "$fam" rule add priority $((prio + 9)) uidrange "$uid-$uid" lookup "$table"
done
if [ -r /etc/resolv.conf ]; then
  for ns in $(awk '$1 == "nameserver" && $2 !~ /%%/ { print $2 }' /etc/resolv.conf); do
    case "$ns" in *:*) fam=-6 ;; *) fam=-4 ;; esac
    ip "$fam" rule add priority $((prio + 1)) to "$ns" lookup main
  done
fi
ip link del "$dev" 2>/dev/null || true
ip link add "$dev" type wireguard
wg setconf "$dev" %s
`, WireGuardInterface, WireGuardTable, wireGuardRulePriority, proxyUser, port, WireGuardConfPath)
	fams := map[string]bool{}
	for _, a := range wg.Addresses {
		fmt.Fprintf(&b, "ip address add %s dev \"$dev\"\n", a)
		if a.Addr().Is4() {
			fams["-4"] = true
		} else {
			fams["-6"] = true
		}
	}
	if wg.MTU > 0 {
		fmt.Fprintf(&b, "ip link set \"$dev\" mtu %d\n", wg.MTU)
	}
	b.WriteString("ip link set \"$dev\" up\n")
	for _, f := range []string{"-4", "-6"} {
		if fams[f] {
			fmt.Fprintf(&b, "ip %s route add default dev \"$dev\" table \"$table\" metric 10\n", f)
		}
	}
	// The endpoint as wg resolved it ("<key>\t203.0.113.1:51820", "[2001:db8::1]:51820"),
	// into the fence's sets: the tunnel's own packets carry the proxy user's socket.
	fmt.Fprintf(&b, `wg show "$dev" endpoints | while read -r _ ep; do
  port=${ep##*:} addr=${ep%%:*}
  case "$addr" in
    \[*) addr=${addr#[} addr=${addr%%]} set=%s ;;
    *) set=%s ;;
  esac
  nft add element %s "$set" "{ $addr . $port }"
  echo "wireguard egress: the fence lets the tunnel's packets to $addr port $port through"
done
`, FenceWireGuardEndpoints6, FenceWireGuardEndpoints4, FenceTable)
	b.WriteString("echo \"wireguard egress: $dev up; the proxy user's connections use table $table only\"\n")
	return b.String()
}

// WireGuardFunc returns the WireGuard configuration spec.proxy.egress.wireguard names,
// or nil when it names none. Errors the user fixes wrap ErrWireGuardSecret.
type WireGuardFunc func(ctx context.Context, px *v1alpha1.Proxy) (*WireGuard, error)

// SecretWireGuard reads WireGuard Secrets as SecretCredentials reads basic-auth ones:
// only opted-in Secrets, through Reader (the manager's cache of them), with Metadata to
// tell a missing Secret from an unlabelled one.
type SecretWireGuard struct {
	Reader   client.Reader
	Metadata client.Reader
}

var _ WireGuardFunc = SecretWireGuard{}.WireGuard

// WireGuard reads and parses the Secret px's spec.proxy.egress.wireguard names.
func (s SecretWireGuard) WireGuard(ctx context.Context, px *v1alpha1.Proxy) (*WireGuard, error) {
	name, field := px.WireGuardRef()
	if name == "" {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: px.Namespace, Name: name}
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, secretNotFound(ctx, s.Metadata, key, field, ErrWireGuardSecret, ErrWireGuardSecret)
		}
		return nil, fmt.Errorf("reading secret %s (%s): %w", key, field, err)
	}
	if !OptedIn(&sec) {
		return nil, notOptedIn(key, field, ErrWireGuardSecret)
	}
	wg, err := WireGuardOf(&sec)
	if err != nil {
		return nil, fmt.Errorf("secret %s (%s): %w", key, field, err)
	}
	return wg, nil
}

// WireGuardOf parses a WireGuard Secret's data: the key wg0.conf and, when present,
// egressIP. Errors wrap ErrWireGuardSecret and name the key (and line).
func WireGuardOf(sec *corev1.Secret) (*WireGuard, error) {
	conf, ok := sec.Data[SecretKeyWireGuard]
	if !ok || len(bytes.TrimSpace(conf)) == 0 {
		return nil, fmt.Errorf("%w: no key %q, or it is empty: it must hold one WireGuard configuration in wg-quick form", ErrWireGuardSecret, SecretKeyWireGuard)
	}
	wg, err := ParseWireGuard(string(conf))
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", SecretKeyWireGuard, err)
	}
	if raw, ok := sec.Data[SecretKeyEgressIP]; ok {
		a, err := netip.ParseAddr(strings.TrimSpace(string(raw)))
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %q is not an IP address", ErrWireGuardSecret, SecretKeyEgressIP, strings.TrimSpace(string(raw)))
		}
		wg.EgressIP = a.Unmap()
	}
	return wg, nil
}
