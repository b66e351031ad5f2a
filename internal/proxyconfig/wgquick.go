package proxyconfig

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The parser of wg-quick configurations. A line of one may hold a private or preshared
// key, also where it does not belong ("PrivateKey: <key>", a key pasted on the wrong
// line), and its errors reach status, conditions, Events and the log: so no error quotes
// any part of a line. They name the line number and the key as the parser spells it, or
// say the line is malformed.

// wgKeyNames are the keys a configuration may hold, lower-cased, as messages spell them.
var wgKeyNames = map[string]string{
	"privatekey": "PrivateKey", "address": "Address", "mtu": "MTU",
	"publickey": "PublicKey", "presharedkey": "PresharedKey", "endpoint": "Endpoint",
	"allowedips": "AllowedIPs", "persistentkeepalive": "PersistentKeepalive",
	"dns": "DNS", "table": "Table", "preup": "PreUp", "postup": "PostUp", "predown": "PreDown",
	"postdown": "PostDown", "saveconfig": "SaveConfig", "fwmark": "FwMark", "listenport": "ListenPort",
}

// wgQuickOnly are [Interface] keys of wg-quick the rendering ignores: the operator does
// its own addressing and routing (only the proxy's traffic takes the tunnel) and leaves
// the guest's DNS as it is.
var wgQuickOnly = map[string]bool{
	"dns": true, "table": true, "preup": true, "postup": true, "predown": true, "postdown": true,
	"saveconfig": true, "fwmark": true, "listenport": true,
}

const errNotAKey = "not a WireGuard key (32 bytes in base64, 44 characters)"

// ParseWireGuard parses a configuration in wg-quick form. Its errors wrap
// ErrWireGuardSecret and name the line (1-based) and the key; they never quote a line.
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
				return nil, bad(n, "unknown section; want [Interface] or [Peer], alone on the line")
			}
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, bad(n, "want Key = Value or a [Section]")
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !isKeyName(key) {
			// "PrivateKey: <key>=" lands here: its text before the '=' holds the key.
			return nil, bad(n, "want Key = Value: what stands before the first '=' is not a key name (a ':' in place of the '='?)")
		}
		if err := wg.set(section, strings.ToLower(key), value); err != nil {
			return nil, bad(n, "%v", err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: reading it after line %d: %w", ErrWireGuardSecret, n, err)
	}
	return wg, wg.complete(iface, peers)
}

// isKeyName: s has the shape of a key, letters only.
func isKeyName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return s != ""
}

// set sets the key k (lower-cased) of section to value. Its errors name the key as
// wgKeyNames spell it, never k itself, and never quote the value.
func (wg *WireGuard) set(section, k, value string) error {
	name := wgKeyNames[k]
	switch section {
	case "interface":
		switch {
		case k == "privatekey":
			return setKey(&wg.PrivateKey, name, value)
		case k == "address":
			ps, err := prefixes(name, value, true)
			wg.Addresses = append(wg.Addresses, ps...)
			return err
		case k == "mtu":
			m, err := strconv.Atoi(value)
			if err != nil || m < 1280 || m > 9000 {
				return fmt.Errorf("%s: not a number from 1280 to 9000", name)
			}
			wg.MTU = m
		case wgQuickOnly[k]:
		default:
			return errors.New("unknown [Interface] key; it takes PrivateKey, Address and MTU, and ignores wg-quick's DNS, Table, ListenPort, FwMark, SaveConfig, PreUp, PostUp, PreDown and PostDown")
		}
	case "peer":
		p := &wg.Peer
		switch k {
		case "publickey":
			return setKey(&p.PublicKey, name, value)
		case "presharedkey":
			return setKey(&p.PresharedKey, name, value)
		case "endpoint":
			host, port, err := net.SplitHostPort(value)
			if err != nil || host == "" || strings.ContainsAny(host, " \t\"'`$\\;") {
				return fmt.Errorf("%s: not host:port", name)
			}
			if pn, err := strconv.Atoi(port); err != nil || pn < 1 || pn > 65535 {
				return fmt.Errorf("%s: no port from 1 to 65535", name)
			}
			p.Endpoint = value
		case "allowedips":
			ps, err := prefixes(name, value, false)
			p.AllowedIPs = append(p.AllowedIPs, ps...)
			return err
		case "persistentkeepalive":
			if value == "off" {
				return nil
			}
			s, err := strconv.Atoi(value)
			if err != nil || s < 0 || s > 65535 {
				return fmt.Errorf("%s: not a number of seconds from 0 to 65535, nor off", name)
			}
			p.PersistentKeepalive = s
		default:
			return errors.New("unknown [Peer] key; it takes PublicKey, PresharedKey, Endpoint, AllowedIPs and PersistentKeepalive")
		}
	default:
		if name == "" {
			name = "a key"
		}
		return fmt.Errorf("%s: outside a section; the configuration starts with [Interface]", name)
	}
	return nil
}

// setKey sets *dst to value, a WireGuard key, for the key name.
func setKey(dst *string, name, value string) error {
	if !isKey(value) {
		return fmt.Errorf("%s: %s", name, errNotAKey)
	}
	*dst = value
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

// prefixes parses the key name's comma-separated list of CIDRs; hosts keeps the host
// bits (an interface address), otherwise they are cleared. An error names the item by
// its position.
func prefixes(name, value string, hosts bool) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, f := range strings.Split(value, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("%s: item %d is not an address or a network in CIDR notation", name, i+1)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !hosts {
			p = p.Masked()
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", name)
	}
	return out, nil
}
