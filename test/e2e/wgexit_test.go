//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/curve25519"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// wgExit is a WireGuard exit on this machine, playing a VPN provider's: a network
// namespace with a port on the bridge (the guest's tunnel endpoint), wireguard-go (in
// userspace: the host's kernel need not have the module, the guest's has) as the guest's
// one peer, and a veth to the edge namespace, where internetAddr is, from an address of
// its own in TEST-NET-2. The exit forwards from the tunnel to that veth alone, masquerading
// to its address, so the internet stand-in sees each exit's traffic from that address. It
// has no default route and forwards nothing else: a guest's traffic reaches the stand-in
// through a running exit, or, if it leaks, from the guest's own address (the edge is on
// the bridge), never from an exit's.
type wgExit struct {
	n        int
	ns       string // the namespace
	link     string // its port on the bridge, host side
	inet     string // its veth to the edge namespace, edge side
	dev      string // the WireGuard interface; wireguard-go's control socket is /var/run/wireguard/<dev>.sock, not per namespace
	endpoint string // bridge address:port the guest sends the tunnel to
	egress   string // the address the internet stand-in sees
	tunnel   netip.Prefix
	guest    netip.Prefix // the guest's tunnel address

	exitKey, guestKey [32]byte

	cmd    *exec.Cmd
	exited <-chan struct{}
}

const wgPort = 51820

// newWGExits builds n exits, numbered 1..n: exit i has the bridge address .241+i (above
// the edge's .240 and .241), egress address 198.51.100.i and tunnel 10.200.i.0/24. The
// edge namespace must exist.
func newWGExits(t *testing.T, h framework.HostEnv, e *edge, n int) []*wgExit {
	t.Helper()
	subnet, err := netip.ParsePrefix(h.BridgeSubnet)
	if err != nil || !subnet.Addr().Is4() || subnet.Bits() > 24 {
		t.Fatalf("bridge subnet %q: want an IPv4 network of /24 or larger", h.BridgeSubnet)
	}
	var exits []*wgExit
	for i := 1; i <= n; i++ {
		b := subnet.Masked().Addr().As4()
		b[3] = byte(241 + i)
		x := &wgExit{
			n: i, ns: fmt.Sprintf("epo-e2e-x%d", i), link: fmt.Sprintf("epo-e2e-x%d", i), inet: fmt.Sprintf("epo-e2e-i%d", i),
			dev:      fmt.Sprintf("epo-e2e-wg%d", i),
			endpoint: fmt.Sprintf("%s:%d", netip.AddrFrom4(b), wgPort),
			egress:   fmt.Sprintf("198.51.100.%d", i),
			tunnel:   netip.MustParsePrefix(fmt.Sprintf("10.200.%d.1/24", i)),
			guest:    netip.MustParsePrefix(fmt.Sprintf("10.200.%d.2/32", i)),
		}
		x.remove() // left over by a run cut short
		t.Cleanup(x.remove)
		x.exitKey, x.guestKey = wgKey(t), wgKey(t)
		bits := fmt.Sprint(subnet.Bits())
		ipt := []string{"netns", "exec", x.ns, "iptables"}
		for _, args := range [][]string{
			{"netns", "add", x.ns},
			{"link", "add", x.link, "type", "veth", "peer", "name", "eth0", "netns", x.ns},
			{"link", "set", x.link, "master", h.Bridge, "up"},
			{"-n", x.ns, "addr", "add", netip.AddrFrom4(b).String() + "/" + bits, "dev", "eth0"},
			{"-n", x.ns, "link", "set", "lo", "up"},
			{"-n", x.ns, "link", "set", "eth0", "up"},
			// The way out: a veth whose other end is in the edge namespace.
			{"-n", e.ns, "link", "add", x.inet, "type", "veth", "peer", "name", "inet", "netns", x.ns},
			{"-n", x.ns, "addr", "add", x.egress + "/32", "dev", "inet"},
			{"-n", x.ns, "link", "set", "inet", "up"},
			{"-n", e.ns, "link", "set", x.inet, "up"},
			{"-n", x.ns, "route", "add", internetAddr + "/32", "dev", "inet", "src", x.egress},
			{"-n", e.ns, "route", "add", x.egress + "/32", "dev", x.inet},
			// Forward from the tunnel to the stand-in and back, nothing else.
			{"netns", "exec", x.ns, "sh", "-c", "echo 1 >/proc/sys/net/ipv4/ip_forward"},
			append(ipt, "-P", "FORWARD", "DROP"),
			append(ipt, "-A", "FORWARD", "-i", x.dev, "-o", "inet", "-j", "ACCEPT"),
			append(ipt, "-A", "FORWARD", "-i", "inet", "-o", x.dev, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"),
			append(ipt, "-t", "nat", "-A", "POSTROUTING", "-o", "inet", "-j", "MASQUERADE"),
		} {
			ipCmd(t, args...)
		}
		x.start(t)
		ipCmd(t, "-n", x.ns, "addr", "add", x.tunnel.String(), "dev", x.dev)
		ipCmd(t, "-n", x.ns, "link", "set", x.dev, "up")
		t.Logf("WireGuard exit %d: namespace %s, endpoint %s, tunnel %s (guest %s), egress %s on %s to the edge",
			i, x.ns, x.endpoint, x.tunnel, x.guest, x.egress, x.inet)
		exits = append(exits, x)
	}
	return exits
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// wgKey is a new Curve25519 private key, clamped as WireGuard's are.
func wgKey(t *testing.T) [32]byte {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k
}

func wgPublic(t *testing.T, priv [32]byte) string {
	pub, err := curve25519.X25519(priv[:], curve25519.Basepoint)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(pub)
}

// start runs wireguard-go in the foreground in the exit's namespace, tied to the test
// binary's life (startTied), and configures it once its control socket is
// there: its key, its port, and the guest as its one peer.
func (x *wgExit) start(t *testing.T) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), x.dev+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", x.ns, "wireguard-go", "-f", x.dev)
	exited, err := startTied(cmd, f)
	if err != nil {
		t.Fatalf("starting wireguard-go for %s: %v", x.dev, err)
	}
	x.cmd, x.exited = cmd, exited
	sock := wgSocket(x.dev)
	testutil.WaitFor(t, 30*time.Second, "wireguard-go's control socket "+sock, func() (bool, error) {
		select {
		case <-exited:
			data, _ := os.ReadFile(logPath)
			t.Fatalf("wireguard-go for %s exited: %s", x.dev, data)
		default:
		}
		_, err := os.Stat(sock)
		return err == nil, err
	}, testutil.Every(100*time.Millisecond))
	keyFile := filepath.Join(t.TempDir(), x.dev+".key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(x.exitKey[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", x.ns, "wg", "set", x.dev, "private-key", keyFile,
		"listen-port", fmt.Sprint(wgPort), "peer", wgPublic(t, x.guestKey), "allowed-ips", x.guest.String()).CombinedOutput(); err != nil {
		t.Fatalf("wg set %s: %v: %s", x.dev, err, out)
	}
}

// stop ends wireguard-go, which takes its interface with it: from then on the guest's
// tunnel packets reach a closed port.
func (x *wgExit) stop() {
	if x.cmd == nil {
		return
	}
	_ = x.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-x.exited:
	case <-time.After(30 * time.Second):
		_ = x.cmd.Process.Kill()
		<-x.exited
	}
	x.cmd = nil
}

// remove takes the exit down, also what a run cut short left: a wireguard-go killed
// with the test binary leaves its control socket behind, and start, which waits for the
// socket, would then configure through the stale one before the new wireguard-go has
// replaced it (wg, refused there, falls back to the kernel: "Unable to modify interface:
// Protocol not supported").
func (x *wgExit) remove() {
	x.stop()
	_ = exec.Command("ip", "netns", "del", x.ns).Run() // takes both veth pairs with it
	_ = exec.Command("ip", "link", "del", x.link).Run()
	_ = exec.Command("ip", "-n", edgeNS, "link", "del", x.inet).Run()
	_ = os.Remove(wgSocket(x.dev))
}

// wgSocket is wireguard-go's control socket of interface dev.
func wgSocket(dev string) string { return "/var/run/wireguard/" + dev + ".sock" }

// secret is the exit's WireGuard Secret for the guest, in wg-quick form, opted in and
// carrying labels, with the exit's address as egressIP.
func (x *wgExit) secret(t *testing.T, namespace string, labels map[string]string) *corev1.Secret {
	conf := fmt.Sprintf(`[Interface]
PrivateKey = %s
Address = %s

[Peer]
PublicKey = %s
Endpoint = %s
AllowedIPs = 0.0.0.0/0
`, base64.StdEncoding.EncodeToString(x.guestKey[:]), x.guest, wgPublic(t, x.exitKey), x.endpoint)
	l := map[string]string{v1alpha1.CredentialsLabel: "true"}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("e2e-exit-%d", x.n), Labels: l},
		StringData: map[string]string{proxyconfig.SecretKeyWireGuard: conf, proxyconfig.SecretKeyEgressIP: x.egress},
	}
}
