package proxyconfig

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Test keys: 32 bytes in base64, none of them anyone's.
const (
	testWGPrivateKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	testWGPublicKey  = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	testWGPSK        = "FpCyhws9cxwWoV4xELtfJvjJN+zQVRPISllRWgeopVE="
)

// SampleWireGuardConf is a complete wg-quick configuration as a VPN provider hands it out.
func sampleWGConf() string {
	return `# exit 1
[Interface]
PrivateKey = ` + testWGPrivateKey + `
Address = 10.64.0.2/32, fd00:64::2/128
DNS = 10.64.0.1
MTU = 1380

[Peer]
PublicKey = ` + testWGPublicKey + `
PresharedKey = ` + testWGPSK + `
Endpoint = 198.51.100.7:51820
AllowedIPs = 0.0.0.0/0, ::/0
PersistentKeepalive = 25
`
}

func TestParseWireGuard(t *testing.T) {
	wg, err := ParseWireGuard(sampleWGConf())
	if err != nil {
		t.Fatal(err)
	}
	if wg.PrivateKey != testWGPrivateKey || len(wg.Addresses) != 2 || wg.Addresses[0].String() != "10.64.0.2/32" ||
		wg.MTU != 1380 || wg.Peer.PublicKey != testWGPublicKey || wg.Peer.Endpoint != "198.51.100.7:51820" ||
		len(wg.Peer.AllowedIPs) != 2 || wg.Peer.PersistentKeepalive != 25 || wg.Peer.PresharedKey != testWGPSK {
		t.Errorf("parsed %+v", wg)
	}
	repl := func(old, new string) string { return strings.Replace(sampleWGConf(), old, new, 1) }
	for _, tc := range []struct{ name, conf, want string }{
		{"bad private key", repl(testWGPrivateKey, "c2hvcnQ="), "line 3: PrivateKey: not a WireGuard key"},
		{"bad public key", repl("PublicKey = "+testWGPublicKey, "PublicKey = nope"), "line 9: PublicKey: not a WireGuard key"},
		{"no equals", repl("MTU = 1380", "MTU 1380"), "line 6: want Key = Value or a [Section]"},
		{"bad address", repl("10.64.0.2/32", "10.64.0.300/32"), "line 4: Address: item 1 is not an address"},
		{"unknown section", repl("[Peer]", "[Peers]"), "line 8: unknown section; want [Interface] or [Peer]"},
		{"unknown key", repl("MTU = 1380", "Mtuu = 1380"), "line 6: unknown [Interface] key"},
		{"endpoint without port", repl("198.51.100.7:51820", "198.51.100.7"), "line 11: Endpoint: not host:port"},
		{"two peers", sampleWGConf() + "[Peer]\nPublicKey = " + testWGPublicKey + "\n", "line 14: a second [Peer] section"},
		{"key outside a section", "PrivateKey = " + testWGPrivateKey + "\n", "line 1: PrivateKey: outside a section"},
		{"no peer", strings.Split(sampleWGConf(), "[Peer]")[0], "no [Peer] section"},
		{"no address", repl("Address = 10.64.0.2/32, fd00:64::2/128\n", ""), "[Interface] has no Address"},
		{"no endpoint", repl("Endpoint = 198.51.100.7:51820\n", ""), "[Peer] has no Endpoint"},
		{"split tunnel", repl("0.0.0.0/0, ::/0", "10.0.0.0/8"), "AllowedIPs lacks 0.0.0.0/0"},
	} {
		_, err := ParseWireGuard(tc.conf)
		if !errors.Is(err, ErrWireGuardSecret) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrWireGuardSecret saying %q", tc.name, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), testWGPrivateKey) || strings.Contains(err.Error(), testWGPSK)) {
			t.Errorf("%s: the error quotes a key: %v", tc.name, err)
		}
	}
}

func wgProxy(secretName string, assigned bool) *v1alpha1.Proxy {
	px := proxyWithAuth(v1alpha1.ProxyModeManaged, "auth")
	px.Spec.Proxy.BasicAuth = nil
	px.Spec.Port = 3128
	ref := &v1alpha1.WireGuardSecretRef{Name: v1alpha1.SecretName(secretName)}
	px.Spec.Proxy.Egress = &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{SecretRef: ref}}
	if assigned {
		px.Spec.Proxy.Egress.WireGuard = &v1alpha1.ProxyWireGuard{AssignedSecretRef: ref}
	}
	return px
}

// The Secret is read like a credentials Secret (opted in only) and every fault names the
// Secret, the field that names it and the key or line.
func TestSecretWireGuard(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	unlabelled := secret("unlabelled", map[string]string{SecretKeyWireGuard: sampleWGConf()})
	unlabelled.Labels = nil
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		secret("exit1", map[string]string{SecretKeyWireGuard: sampleWGConf(), SecretKeyEgressIP: " 198.51.100.7\n"}),
		secret("no-key", map[string]string{"wg.conf": sampleWGConf()}),
		secret("bad-line", map[string]string{SecretKeyWireGuard: strings.Replace(sampleWGConf(), "MTU = 1380", "MTU 1380", 1)}),
		secret("bad-egress", map[string]string{SecretKeyWireGuard: sampleWGConf(), SecretKeyEgressIP: "exit.example"}),
		unlabelled,
	).Build()
	ctx := context.Background()
	s := SecretWireGuard{Reader: c, Metadata: c}
	wg, err := s.WireGuard(ctx, wgProxy("exit1", false))
	if err != nil || wg.EgressIP.String() != "198.51.100.7" || wg.PrivateKey != testWGPrivateKey {
		t.Fatalf("exit1: %+v %v", wg, err)
	}
	if wg, err := s.WireGuard(ctx, proxyWithAuth(v1alpha1.ProxyModeManaged, "x")); wg != nil || err != nil {
		t.Errorf("no wireguard: %+v %v", wg, err)
	}
	for _, tc := range []struct {
		name string
		px   *v1alpha1.Proxy
		want string
	}{
		{"missing", wgProxy("nope", false), "secret crawl/nope (spec.proxy.egress.wireguard.secretRef) does not exist"},
		{"no key", wgProxy("no-key", true), `secret crawl/no-key (spec.proxy.egress.wireguard.assignedSecretRef): wireguard secret unusable: no key "wg0.conf"`},
		{"bad line", wgProxy("bad-line", false), `secret crawl/bad-line (spec.proxy.egress.wireguard.secretRef): key "wg0.conf": wireguard secret unusable: line 6: want Key = Value`},
		{"bad egressIP", wgProxy("bad-egress", false), `key "egressIP" does not hold an IP address`},
		{"unlabelled", wgProxy("unlabelled", false), `secret crawl/unlabelled (spec.proxy.egress.wireguard.secretRef) lacks the label egress.hrajfrisbee.cz/proxy-credentials: "true"`},
	} {
		_, err := s.WireGuard(ctx, tc.px)
		if !errors.Is(err, ErrWireGuardSecret) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrWireGuardSecret saying %q", tc.name, err, tc.want)
		}
	}
}

// The rendered cloud-config carries the tunnel: its configuration (wg(8) keys only,
// 0600), the routing script as a second ExecStartPre of tinyproxy after the fence, and
// wireguard-tools installed before tinyproxy. The script makes the proxy user's traffic
// fail-closed before the tunnel exists and keeps the proxy's port and DNS on the main
// table.
func TestCloudConfigWireGuard(t *testing.T) {
	wg, err := ParseWireGuard(sampleWGConf())
	if err != nil {
		t.Fatal(err)
	}
	c := sampleConfig()
	c.WireGuard = wg
	doc, err := CloudConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	var cc struct {
		Bootcmd    []string `json:"bootcmd"`
		WriteFiles []struct {
			Path, Permissions, Content string
		} `json:"write_files"`
		Runcmd []any `json:"runcmd"`
	}
	if err := yaml.Unmarshal(doc, &cc); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	files := map[string]string{}
	perms := map[string]string{}
	for _, f := range cc.WriteFiles {
		files[f.Path], perms[f.Path] = f.Content, f.Permissions
	}
	conf := files[WireGuardConfPath]
	if perms[WireGuardConfPath] != "0600" || !strings.Contains(conf, "PrivateKey = "+testWGPrivateKey) ||
		!strings.Contains(conf, "Endpoint = 198.51.100.7:51820") || !strings.Contains(conf, "AllowedIPs = 0.0.0.0/0, ::/0") ||
		strings.Contains(conf, "Address") || strings.Contains(conf, "DNS") || strings.Contains(conf, "MTU") {
		t.Errorf("wg configuration (%s):\n%s", perms[WireGuardConfPath], conf)
	}
	script := files[WireGuardScriptPath]
	for _, want := range []string{
		"set -eu",
		`ip "$fam" route add unreachable default table "$table" metric 100`,
		`ip "$fam" rule add priority "$prio" ipproto tcp sport 3128 lookup main`,
		`ip "$fam" rule add priority $((prio + 9)) uidrange "$uid-$uid" lookup "$table"`,
		`ip "$fam" rule add priority $((prio + 1)) to "$ns" lookup main`,
		"uid=$(id -u tinyproxy)",
		`ip link add "$dev" type wireguard`,
		"wg setconf \"$dev\" " + WireGuardConfPath,
		`ip address add 10.64.0.2/32 dev "$dev"`,
		`ip address add fd00:64::2/128 dev "$dev"`,
		`ip link set "$dev" mtu 1380`,
		`ip -4 route add default dev "$dev" table "$table" metric 10`,
		`ip -6 route add default dev "$dev" table "$table" metric 10`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q:\n%s", want, script)
		}
	}
	// Fail-closed: the unreachable default and the rules come before the device exists.
	if strings.Index(script, "unreachable default") > strings.Index(script, "type wireguard") ||
		strings.Index(script, "uidrange") > strings.Index(script, "type wireguard") {
		t.Errorf("the routing is set up after the tunnel:\n%s", script)
	}
	if strings.Contains(script, testWGPrivateKey) {
		t.Error("the script holds the private key")
	}
	dropIn := strings.Join(cc.Bootcmd, "\n")
	fence, tunnel := strings.Index(dropIn, "ExecStartPre=/bin/sh "+FenceScriptPath), strings.Index(dropIn, "ExecStartPre=/bin/sh "+WireGuardScriptPath)
	if fence < 0 || tunnel < fence {
		t.Errorf("the drop-in does not run the fence, then the tunnel:\n%s", dropIn)
	}
	var installs []string
	for _, r := range cc.Runcmd {
		if l, ok := r.([]any); ok && len(l) == 3 && l[0] == "sh" {
			installs = append(installs, l[2].(string))
		}
	}
	if len(installs) != 3 || !strings.Contains(installs[1], "command -v wg ") || !strings.Contains(installs[1], "wireguard-tools") ||
		!strings.Contains(installs[2], "tinyproxy") {
		t.Errorf("runcmd installs %q, want nftables, wireguard-tools, tinyproxy", installs)
	}

	// Without WireGuard nothing of it is rendered.
	plain, _ := CloudConfig(sampleConfig())
	if strings.Contains(string(plain), "wireguard") || strings.Contains(string(plain), WireGuardScriptPath) {
		t.Errorf("rendered without WireGuard:\n%s", plain)
	}
}

// The hash input carries a digest of the keys, never the keys; another configuration
// or egress address is another digest.
func TestWireGuardHashInput(t *testing.T) {
	wg, _ := ParseWireGuard(sampleWGConf())
	c := sampleConfig()
	c.WireGuard = wg
	in, err := SpecHashInput(c, "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(in, testWGPrivateKey) || strings.Contains(in, testWGPSK) || !strings.Contains(in, "PrivateKey = sha256:") {
		t.Errorf("hash input:\n%s", in)
	}
	if wg.PrivateKey != testWGPrivateKey {
		t.Error("the hash input changed the configuration")
	}
	other, _ := ParseWireGuard(strings.Replace(sampleWGConf(), "198.51.100.7", "198.51.100.8", 1))
	if other.Digest() == wg.Digest() {
		t.Error("another endpoint, the same digest")
	}
	withIP := *wg
	withIP.EgressIP = other.EgressIP
	if d := wg.Digest(); d != withIP.Digest() {
		t.Error("an unset egress address changed the digest")
	}
}

// TestWireGuardScriptOpensTheFenceToItsEndpoint runs the rendered tunnel script with
// stand-ins for id, ip, wg and nft: once the tunnel is up it adds the endpoint wg
// resolved (IPv4 or IPv6, address and port) to the fence's sets, since the tunnel's own
// packets carry the proxy user's socket and the fence would refuse an endpoint on a
// private network (an exit on the LAN). The fence lets exactly those through, after the
// metadata refusal and before the private ranges.
func TestWireGuardScriptOpensTheFenceToItsEndpoint(t *testing.T) {
	wg, err := ParseWireGuard(sampleWGConf())
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ shown, want string }{
		"ipv4": {"10.123.0.242:51820", "nft add element " + FenceTable + " wg_endpoints4 { 10.123.0.242 . 51820 }"},
		"ipv6": {"[fd00:7::5]:4500", "nft add element " + FenceTable + " wg_endpoints6 { fd00:7::5 . 4500 }"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "calls")
			stubs := map[string]string{
				"id":  "echo 100",
				"ip":  `echo "ip $*" >>` + log + "\n" + `case "$*" in *"rule del"*) exit 2 ;; esac`,
				"wg":  `echo "wg $*" >>` + log + "\n" + `[ "$1" = show ] && printf 'cHVibGljLWtleS1vZi10aGUtZXhpdC1wZWVyLTMyYnl0ZXM=\t%s\n' ` + tc.shown + "\nexit 0",
				"nft": `echo "nft $*" >>` + log,
			}
			bin := filepath.Join(dir, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			for n, body := range stubs {
				if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			script := strings.ReplaceAll(wireGuardScript(wg, 3128), "/etc/resolv.conf", filepath.Join(dir, "resolv.conf"))
			cmd := exec.Command("/bin/sh", "-c", script)
			cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the script: %v\n%s", err, out)
			}
			calls, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(calls)), "\n")
			var nft []string
			up, added := -1, -1
			for i, l := range lines {
				if strings.HasPrefix(l, "nft ") {
					nft = append(nft, l)
					added = i
				}
				if l == "ip link set epo-wg0 up" {
					up = i
				}
			}
			if len(nft) != 1 || nft[0] != tc.want {
				t.Errorf("nft calls %q, want [%q]", nft, tc.want)
			}
			if up < 0 || added < up {
				t.Errorf("the endpoint is added before the tunnel is up; calls:\n%s", calls)
			}
		})
	}
	rs := fenceRuleset(nil)
	meta, v4, v6, allowed := strings.Index(rs, "ip6 daddr @metadata6 goto refuse"),
		strings.Index(rs, "ip daddr . udp dport @wg_endpoints4 accept"),
		strings.Index(rs, "ip6 daddr . udp dport @wg_endpoints6 accept"),
		strings.Index(rs, "ip daddr @allowed4 accept")
	if meta < 0 || v4 < meta || v6 < v4 || allowed < v6 {
		t.Errorf("the ruleset does not accept the endpoints after the metadata refusal and before the rest:\n%s", rs)
	}
	for _, set := range []string{"set wg_endpoints4 {\n\t\ttype ipv4_addr . inet_service\n", "set wg_endpoints6 {\n\t\ttype ipv6_addr . inet_service\n"} {
		if !strings.Contains(rs, set) {
			t.Errorf("the ruleset lacks %q:\n%s", set, rs)
		}
	}
}
