package proxyconfig

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
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
			return nil, fmt.Errorf("%w: key %q does not hold an IP address", ErrWireGuardSecret, SecretKeyEgressIP)
		}
		wg.EgressIP = a.Unmap()
	}
	return wg, nil
}
