//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// internetAddr is the stand-in for an address on the internet: a documentation address
// (TEST-NET-3) the guest's egress fence must let through.
const internetAddr = "203.0.113.10"

// edge is a network namespace of the test's own on the bridge, playing the networks
// around a guest: allowed, a private address the Proxy lists in allowedDestinations (the
// probe target's, as with an in-cluster probe target); refused, another private address
// on the bridge; and internetAddr, routed through allowed (the guest gets that route from
// the test's cloud-init). The host's guard rules forward nothing from the bridge, so the
// namespace is the router: traffic to it is bridged, never seen by the host's INPUT.
type edge struct {
	ns               string
	allowed, refused string
}

// edgeLink is the namespace's veth on the host side, a port of the bridge.
const (
	edgeNS   = "epo-e2e-edge"
	edgeLink = "epo-e2e-edge"
)

func newEdge(t *testing.T, h framework.HostEnv) *edge {
	t.Helper()
	subnet, err := netip.ParsePrefix(h.BridgeSubnet)
	if err != nil || !subnet.Addr().Is4() || subnet.Bits() > 24 {
		t.Fatalf("bridge subnet %q: want an IPv4 network of /24 or larger", h.BridgeSubnet)
	}
	// Above the DHCP range (.100-.199) of hack/libvirt-host.sh.
	b := subnet.Masked().Addr().As4()
	b[3] = 240
	allowed := netip.AddrFrom4(b).String()
	b[3] = 241
	refused := netip.AddrFrom4(b).String()
	e := &edge{ns: edgeNS, allowed: allowed, refused: refused}
	e.remove() // left over by a run cut short
	t.Cleanup(e.remove)
	bits := fmt.Sprint(subnet.Bits())
	for _, args := range [][]string{
		{"netns", "add", edgeNS},
		{"link", "add", edgeLink, "type", "veth", "peer", "name", "eth0", "netns", edgeNS},
		{"link", "set", edgeLink, "master", h.Bridge, "up"},
		{"-n", edgeNS, "addr", "add", allowed + "/" + bits, "dev", "eth0"},
		{"-n", edgeNS, "addr", "add", refused + "/" + bits, "dev", "eth0"},
		{"-n", edgeNS, "addr", "add", internetAddr + "/32", "dev", "lo"},
		{"-n", edgeNS, "link", "set", "lo", "up"},
		{"-n", edgeNS, "link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Logf("edge namespace %s on %s: allowed %s, refused %s, internet stand-in %s routed through %s",
		edgeNS, h.Bridge, allowed, refused, internetAddr, allowed)
	return e
}

func (e *edge) remove() {
	_ = exec.Command("ip", "netns", "del", e.ns).Run() // takes the veth pair with it
	_ = exec.Command("ip", "link", "del", edgeLink).Run()
}

// serve runs h on a free port of addr, one of the namespace's addresses, and returns the
// base URL. The socket is made inside the namespace and stays there; it is served from
// the test's own.
func (e *edge) serve(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This thread enters the namespace and is never given back to the scheduler
		// (the goroutine ends locked), so no other goroutine runs in it.
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+e.ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: fmt.Errorf("opening network namespace %s: %w", e.ns, err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("entering network namespace %s: %w", e.ns, err)}
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		ch <- result{ln, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, e.ns, r.err)
	}
	return framework.ServeListener(t, r.ln, h)
}

// routeCloudInit is the user cloud-init of the test's Proxy: a route to the internet
// stand-in through the edge namespace. bootcmd runs after systemd-networkd (the test
// image's network manager) has configured the link from DHCP, and a reload does not
// apply a new drop-in to a configured link, so the route is also added at once; the
// drop-in keeps it when networkd configures the link again (a renewal, a restart).
func (e *edge) routeCloudInit() string {
	return fmt.Sprintf(`#cloud-config
bootcmd:
  - |
    mkdir -p /etc/systemd/network/80-dhcp.network.d
    printf '[Route]\nDestination=%[1]s/32\nGateway=%[2]s\n' >/etc/systemd/network/80-dhcp.network.d/90-e2e-internet.conf
    networkctl reload || true
    ip route replace %[1]s/32 via %[2]s
`, internetAddr, e.allowed)
}
