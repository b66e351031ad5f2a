package proxyconfig

import (
	"errors"
	"math/rand"
	"regexp"
	"strings"
	"testing"
)

// secretKeys are the keys of sampleWGConf a message must never show, whole or in part.
var secretKeys = []string{testWGPrivateKey, testWGPSK}

// quotesAKey reports whether msg holds any 8 consecutive characters of a secret key:
// a message that shows part of a line may show part of a key.
func quotesAKey(msg string) bool {
	for _, k := range secretKeys {
		for i := 0; i+8 <= len(k); i++ {
			if strings.Contains(msg, k[i:i+8]) {
				return true
			}
		}
	}
	return false
}

// Every error of the parser, each reached with a line that holds a secret key where it
// does not belong: the message names the line and the key, or says the line is
// malformed, and quotes no part of the line.
func TestParseWireGuardErrorsNeverQuoteAKey(t *testing.T) {
	priv, psk := testWGPrivateKey, testWGPSK
	repl := func(old, new string) string { return strings.Replace(sampleWGConf(), old, new, 1) }
	line := func(l string) string { return repl("MTU = 1380", l) }               // line 6, in [Interface]
	peer := func(l string) string { return repl("PersistentKeepalive = 25", l) } // line 13, in [Peer]
	for _, tc := range []struct{ name, conf, want string }{
		{"colon for equals", repl("PrivateKey = "+priv, "PrivateKey: "+priv), "line 3: want Key = Value"},
		{"colon for equals, no padding", repl("PrivateKey = "+priv, "PrivateKey: "+strings.TrimRight(priv, "=")), "line 3: want Key = Value or a [Section]"},
		{"preshared key with a colon", repl("PresharedKey = "+psk, "PresharedKey: "+psk), "line 10: want Key = Value"},
		{"key alone on a line", line(psk), "line 6: want Key = Value"},
		{"key as a key name", line(strings.TrimRight(psk, "=") + " = 1"), "line 6: want Key = Value"},
		{"letters-only unknown key", line("Secret = " + priv), "line 6: unknown [Interface] key"},
		{"unknown peer key", peer("Key = " + psk), "line 13: unknown [Peer] key"},
		{"unknown section", repl("[Peer]", "["+psk+"]"), "line 8: unknown section"},
		{"bad private key", repl(priv, priv+"AA"), "line 3: PrivateKey: not a WireGuard key"},
		{"bad preshared key", repl(psk, psk[:20]), "line 10: PresharedKey: not a WireGuard key"},
		{"bad public key", repl("PublicKey = "+testWGPublicKey, "PublicKey = "+psk+psk), "line 9: PublicKey: not a WireGuard key"},
		{"key as address", line("Address = 10.0.0.1/32, " + priv), "line 6: Address: item 2 is not an address"},
		{"key as MTU", line("MTU = " + priv), "line 6: MTU: not a number from 1280 to 9000"},
		{"key as endpoint", repl("198.51.100.7:51820", psk), "line 11: Endpoint: not host:port"},
		{"key as endpoint port", repl("198.51.100.7:51820", "198.51.100.7:"+psk), "line 11: Endpoint: no port from 1 to 65535"},
		{"key as allowed IPs", repl("0.0.0.0/0, ::/0", "0.0.0.0/0, "+psk), "line 12: AllowedIPs: item 2 is not an address"},
		{"key as keepalive", peer("PersistentKeepalive = " + psk), "line 13: PersistentKeepalive: not a number of seconds"},
		{"key outside a section", "PrivateKey = " + priv + "\n", "line 1: PrivateKey: outside a section"},
		{"second interface", sampleWGConf() + "[Interface]\nPrivateKey = " + priv + "\n", "line 14: a second [Interface] section"},
		{"second peer", sampleWGConf() + "[Peer]\nPresharedKey = " + psk + "\n", "line 14: a second [Peer] section"},
		{"no peer", strings.Split(sampleWGConf(), "[Peer]")[0], "no [Peer] section"},
		{"no private key", repl("PrivateKey = "+priv+"\n", ""), "[Interface] has no PrivateKey"},
		{"no public key", repl("PublicKey = "+testWGPublicKey+"\n", ""), "[Peer] has no PublicKey"},
		{"split tunnel", repl("0.0.0.0/0, ::/0", "10.0.0.0/8"), "AllowedIPs lacks 0.0.0.0/0"},
		{"overlong line", line("MTU = " + strings.Repeat(priv, 2000)), "reading it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseWireGuard(tc.conf)
			if !errors.Is(err, ErrWireGuardSecret) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want ErrWireGuardSecret saying %q", err, tc.want)
			}
			if err != nil && quotesAKey(err.Error()) {
				t.Errorf("the error quotes a key: %v", err)
			}
		})
	}
}

// mangled are damaged copies of sampleWGConf, made the ways a configuration is damaged
// by hand (a ':' or a space for '=', a lost or doubled character, a key pasted on the
// wrong line, lines swapped or joined), the same ones every run.
func mangled(n int) []string {
	rnd := rand.New(rand.NewSource(40))
	seps := []string{":", " ", "", "==", ": ", "=:", "\t"}
	out := make([]string, 0, n)
	for len(out) < n {
		lines := strings.Split(sampleWGConf(), "\n")
		for m := 1 + rnd.Intn(3); m > 0; m-- {
			i := rnd.Intn(len(lines))
			l := lines[i]
			switch rnd.Intn(7) {
			case 0:
				lines[i] = strings.Replace(l, "=", seps[rnd.Intn(len(seps))], 1)
			case 1:
				if l != "" {
					p := rnd.Intn(len(l))
					lines[i] = l[:p] + l[p+1:]
				}
			case 2:
				p := rnd.Intn(len(l) + 1)
				lines[i] = l[:p] + string("=:[]# ,/+x"[rnd.Intn(10)]) + l[p:]
			case 3:
				lines[i] = l + " " + secretKeys[rnd.Intn(2)]
			case 4:
				if k, _, ok := strings.Cut(l, "="); ok {
					lines[i] = k + "= " + secretKeys[rnd.Intn(2)]
				}
			case 5:
				j := rnd.Intn(len(lines))
				lines[i], lines[j] = lines[j], lines[i]
			case 6:
				if i+1 < len(lines) {
					lines[i] += lines[i+1]
					lines = append(lines[:i+1], lines[i+2:]...)
				}
			}
		}
		out = append(out, strings.Join(lines, "\n"))
	}
	return out
}

var lineNumber = regexp.MustCompile(`line \d+: `)

// FuzzParseWireGuardNeverQuotesAKey: whatever the damage, no error shows any part of the
// private or preshared key. The seeds, run by every go test, are 2,000 damaged copies of
// a real configuration; "KEY" in a fuzzed input stands for a secret key.
//
//fuzzsmoke:count 10000
func FuzzParseWireGuardNeverQuotesAKey(f *testing.F) {
	failed := map[string]bool{}
	for _, conf := range mangled(2000) {
		if _, err := ParseWireGuard(conf); err != nil {
			failed[lineNumber.ReplaceAllString(err.Error(), "")] = true
		}
		f.Add(strings.NewReplacer(testWGPrivateKey, "KEY", testWGPSK, "PSK").Replace(conf))
	}
	// The seeds reach the parser's errors, not its success alone.
	if len(failed) < 20 {
		f.Fatalf("the damaged copies reach %d distinct errors, want most of the parser's: %v", len(failed), failed)
	}
	f.Fuzz(func(t *testing.T, conf string) {
		conf = strings.NewReplacer("KEY", testWGPrivateKey, "PSK", testWGPSK).Replace(conf)
		if _, err := ParseWireGuard(conf); err != nil && quotesAKey(err.Error()) {
			t.Errorf("the error quotes a key: %v\nconfiguration:\n%s", err, conf)
		}
	})
}
