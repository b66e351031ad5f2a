package proxyconfig

import (
	"bufio"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// bootUnits returns the files the rendered bootcmd writes (path to content), in order,
// and the commands it runs besides.
func bootUnits(t *testing.T, doc []byte) (paths []string, files map[string]string, commands []string) {
	t.Helper()
	var cc struct {
		Bootcmd []string `json:"bootcmd"`
	}
	if err := yaml.Unmarshal(doc, &cc); err != nil {
		t.Fatal(err)
	}
	if len(cc.Bootcmd) != 1 {
		t.Fatalf("bootcmd %q, want one script", cc.Bootcmd)
	}
	files = map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(cc.Bootcmd[0]))
	for sc.Scan() {
		line := sc.Text()
		p, ok := strings.CutPrefix(line, "cat >")
		if !ok {
			commands = append(commands, line)
			continue
		}
		p, ok = strings.CutSuffix(p, " <<'EOF'")
		if !ok {
			t.Fatalf("bootcmd line %q: want cat >PATH <<'EOF'", line)
		}
		var body strings.Builder
		for sc.Scan() && sc.Text() != "EOF" {
			body.WriteString(sc.Text() + "\n")
		}
		paths = append(paths, p)
		files[p] = body.String()
	}
	return paths, files, commands
}

// unitKeys reads a systemd unit file's settings as section.key -> values.
func unitKeys(t *testing.T, name, unit string) map[string][]string {
	t.Helper()
	keys := map[string][]string{}
	section := ""
	for _, line := range strings.Split(unit, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: line %q is not a setting of a section", name, line)
			}
			keys[section+"."+k] = append(keys[section+"."+k], v)
		}
	}
	return keys
}

// The units bootcmd writes: tinyproxy starts when cloud-init has written its files (the
// path unit, started by bootcmd, waits for the marker written last; tinyproxy is not
// ordered after sysinit.target, so not after the rest of cloud-init's network stage), behind
// the fence, and on a failure hands over to the retry unit, which runs only after the fence
// found no address and then runs the fence script's retry. tinyproxy itself is never
// restarted by systemd (no Restart=): a fence that cannot be loaded keeps it stopped, not
// restarting.
func TestFenceUnitsRendered(t *testing.T) {
	doc, err := CloudConfig(sampleConfig())
	if err != nil {
		t.Fatal(err)
	}
	paths, files, commands := bootUnits(t, doc)
	if diff := cmp.Diff([]string{TinyproxyDropInPath, FenceRetryUnitPath, TinyproxyStartUnitPath, TinyproxyPathUnitPath,
		LinkRetryScriptPath, LinkRetryUnitPath}, paths); diff != "" {
		t.Errorf("files bootcmd writes (-want +got):\n%s", diff)
	}
	wantCommands := []string{"mkdir -p " + path.Dir(TinyproxyDropInPath) + " " + path.Dir(LinkRetryScriptPath),
		"chmod 0755 " + LinkRetryScriptPath, "systemctl daemon-reload",
		"systemctl start --no-block " + TinyproxyPathUnit, "systemctl enable --quiet " + LinkRetryUnit, "systemctl start --no-block " + LinkRetryUnit}
	if diff := cmp.Diff(wantCommands, commands); diff != "" {
		t.Errorf("bootcmd's commands besides the files (-want +got), the reload, then the path unit's and the link retry's starts, last:\n%s", diff)
	}
	for unit, p := range map[string]string{FenceRetryUnit: FenceRetryUnitPath, TinyproxyPathUnit: TinyproxyPathUnitPath, TinyproxyStartUnit: TinyproxyStartUnitPath} {
		if path.Dir(p) != "/etc/systemd/system" || path.Base(p) != unit {
			t.Errorf("%s is written to %s, want /etc/systemd/system/%s", unit, p, unit)
		}
	}
	dropIn := unitKeys(t, TinyproxyDropInPath, files[TinyproxyDropInPath])
	if diff := cmp.Diff(map[string][]string{
		"Unit.DefaultDependencies": {"no"},
		"Unit.After":               {"local-fs.target systemd-tmpfiles-setup.service"},
		"Unit.Conflicts":           {"shutdown.target"},
		"Unit.Before":              {"shutdown.target"},
		"Unit.ConditionPathExists": {ConfigWrittenPath},
		"Unit.OnFailure":           {FenceRetryUnit},
		"Service.ExecStartPre":     {"/bin/sh " + FenceScriptPath},
		"Service.TimeoutStartSec":  {"5min"},
	}, dropIn); diff != "" {
		t.Errorf("tinyproxy's drop-in (-want +got):\n%s", diff)
	}
	retry := unitKeys(t, FenceRetryUnitPath, files[FenceRetryUnitPath])
	if diff := cmp.Diff(map[string][]string{
		"Unit.Description":         {"Start tinyproxy behind the egress fence once the guest has an address"},
		"Unit.ConditionPathExists": {FenceNoAddressMarker},
		"Service.ExecStart":        {"/bin/sh " + FenceScriptPath + " retry"},
	}, retry); diff != "" {
		t.Errorf("the retry unit (-want +got):\n%s", diff)
	}
	pathUnit := unitKeys(t, TinyproxyPathUnitPath, files[TinyproxyPathUnitPath])
	if diff := cmp.Diff(map[string][]string{
		"Unit.Description":         {"Start tinyproxy once its rendered configuration is written"},
		"Unit.DefaultDependencies": {"no"},
		"Unit.Conflicts":           {"shutdown.target"},
		"Unit.Before":              {"shutdown.target"},
		"Path.PathExists":          {ConfigWrittenPath},
		"Path.Unit":                {TinyproxyStartUnit},
	}, pathUnit); diff != "" {
		t.Errorf("the path unit (-want +got):\n%s", diff)
	}
	// The path unit starts a oneshot that stays active, not tinyproxy: a path unit starts
	// its unit again whenever that unit stops while the path exists, which would start a
	// tinyproxy whose fence cannot load over and over.
	start := unitKeys(t, TinyproxyStartUnitPath, files[TinyproxyStartUnitPath])
	if diff := cmp.Diff(map[string][]string{
		"Unit.Description":         {"Start tinyproxy once per boot behind the egress fence"},
		"Unit.DefaultDependencies": {"no"},
		"Unit.Conflicts":           {"shutdown.target"},
		"Unit.Before":              {"shutdown.target"},
		"Service.Type":             {"oneshot"},
		"Service.RemainAfterExit":  {"yes"},
		"Service.ExecStart":        {"/bin/systemctl --no-block start tinyproxy.service"},
	}, start); diff != "" {
		t.Errorf("the start unit (-want +got):\n%s", diff)
	}
	// The marker is the last file write_files writes, so its existence means the others
	// (configuration, fence, tunnel) are complete when the path unit starts tinyproxy.
	wg, err := ParseWireGuard(sampleWGConf())
	if err != nil {
		t.Fatal(err)
	}
	withTunnel := sampleConfig()
	withTunnel.WireGuard = wg
	for _, c := range []Config{sampleConfig(), withTunnel} {
		doc, err := CloudConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		var cc struct {
			WriteFiles []struct{ Path string } `json:"write_files"`
		}
		if err := yaml.Unmarshal(doc, &cc); err != nil {
			t.Fatal(err)
		}
		if n := len(cc.WriteFiles); n < 2 || cc.WriteFiles[n-1].Path != ConfigWrittenPath {
			t.Errorf("write_files %+v (wireguard %v): want %s last", cc.WriteFiles, c.WireGuard != nil, ConfigWrittenPath)
		}
	}
	// The marker the unit waits on is the one the script leaves, in the directory it makes.
	for _, want := range []string{`marker="` + FenceNoAddressMarker + `"`, `mkdir -p "${marker%/*}"`, "exit " + strconv.Itoa(fenceNoAddressExit)} {
		if !strings.Contains(fenceScript, want) {
			t.Errorf("the fence script lacks %q", want)
		}
	}
}

// fenceRun is one run of the fence script with stand-ins for ip, nft, sleep and systemctl.
type fenceRun struct {
	dir                string
	marker, batch, log string
}

// fenceRoutes are the main table's routes the stand-in for ip lists, by family, in the
// form `ip -o route show table main` prints them.
var fenceRoutes = map[string]string{
	"4": "default via 10.123.0.1 dev enp1s0 proto dhcp src 10.123.0.50 metric 1024\n" +
		"10.123.0.0/24 dev enp1s0 proto kernel scope link src 10.123.0.50 metric 1024",
	"6": "fd00:7::/64 dev enp1s0 proto kernel metric 256 pref medium\n" +
		"default via fd00:7::1 dev enp1s0 proto ra metric 1024 expires 1791sec pref medium",
}

// newFenceRun prepares a run: the guest gets its address after noAddress checks (-1:
// never), and nft fails with nftExit when that is not 0.
func newFenceRun(t *testing.T, noAddress, nftExit int) *fenceRun {
	t.Helper()
	return newFenceRunRoutes(t, noAddress, nftExit, fenceRoutes)
}

// newFenceRunRoutes is newFenceRun whose guest has routes (by family, "4" and "6").
func newFenceRunRoutes(t *testing.T, noAddress, nftExit int, routes map[string]string) *fenceRun {
	t.Helper()
	dir := t.TempDir()
	r := &fenceRun{dir: dir, marker: filepath.Join(dir, "state", "fence-no-address"),
		batch: filepath.Join(dir, "batch.nft"), log: filepath.Join(dir, "calls")}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	never := 0
	if noAddress < 0 {
		never, noAddress = 1, 0
	}
	stubs := map[string]string{
		"ip": `echo "ip $*" >>` + r.log + `
case "$*" in
"-o addr show scope global")
  n=$(cat ` + dir + `/addr-checks 2>/dev/null || echo 0); n=$((n + 1)); echo $n >` + dir + `/addr-checks
  if [ ` + strconv.Itoa(never) + ` = 0 ] && [ "$n" -gt ` + strconv.Itoa(noAddress) + ` ]; then
    echo "2: enp1s0    inet 10.123.0.50/24 metric 1024 brd 10.123.0.255 scope global dynamic enp1s0"
  fi ;;
"-o -4 route show table main") printf '` + routes["4"] + `\n' ;;
"-o -6 route show table main") printf '` + routes["6"] + `\n' ;;
*) echo "unexpected: ip $*" >&2; exit 2 ;;
esac`,
		"nft":       `echo "nft $*" >>` + r.log + "\n[ " + strconv.Itoa(nftExit) + " = 0 ] || exit " + strconv.Itoa(nftExit) + "\ncp \"$2\" " + dir + "/loaded.nft",
		"sleep":     `echo "sleep $*" >>` + r.log,
		"systemctl": `echo "systemctl $*" >>` + r.log,
	}
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "fence.nft"), []byte("# the ruleset\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver 10.123.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs the fence script, its paths moved into the run's directory, and returns its
// exit status and output.
func (r *fenceRun) run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	script := strings.NewReplacer(
		FenceNoAddressMarker, r.marker,
		FenceRulesetPath, filepath.Join(r.dir, "fence.nft"),
		"/run/egress-proxies-operator-fence.nft", r.batch,
		"/etc/resolv.conf", filepath.Join(r.dir, "resolv.conf"),
	).Replace(fenceScript)
	for _, p := range []string{"/etc/", "/run/"} {
		if strings.Contains(script, p) {
			t.Fatalf("the fence script names a path under %s this test does not move:\n%s", p, script)
		}
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "fence.sh"}, args...)...)
	cmd.Env = []string{"PATH=" + filepath.Join(r.dir, "bin") + ":/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("running the fence script: %v\n%s", err, out)
	return 0, ""
}

func (r *fenceRun) calls(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(r.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var calls []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, prefix) {
			calls = append(calls, l)
		}
	}
	return calls
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Stat(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// The fence script's outcomes: loaded (the marker of an earlier try gone), no address
// (the marker and exit 75, nothing loaded), nft failing (its failure, no marker: nothing
// retries it), and the retry (waits for the address, however many checks, then starts
// tinyproxy without waiting for the start).
func TestFenceScript(t *testing.T) {
	t.Run("AddressAfterAWhile", func(t *testing.T) {
		r := newFenceRun(t, 3, 0)
		if err := os.MkdirAll(filepath.Dir(r.marker), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(r.marker, nil, 0o644); err != nil { // an earlier start's
			t.Fatal(err)
		}
		code, out := r.run(t)
		if code != 0 {
			t.Fatalf("exit %d, want 0:\n%s", code, out)
		}
		if exists(t, r.marker) {
			t.Errorf("the marker %s of an earlier start is still there after the fence loaded", r.marker)
		}
		loaded, err := os.ReadFile(filepath.Join(r.dir, "loaded.nft"))
		if err != nil {
			t.Fatalf("nft was not given the batch: %v; calls %q", err, r.calls(t, "nft"))
		}
		want := "# the ruleset\n" +
			"add element inet egress_proxies_operator own4 { 10.123.0.0/24 }\n" +
			"add element inet egress_proxies_operator own6 { fd00:7::/64 }\n" +
			"add element inet egress_proxies_operator resolvers4 { 10.123.0.1 }\n"
		if diff := cmp.Diff(want, string(loaded)); diff != "" {
			t.Errorf("the batch nft loaded (-want +got):\n%s", diff)
		}
		if got := len(r.calls(t, "sleep")); got != 3 {
			t.Errorf("%d waits, want 3 (one per check without an address)", got)
		}
		if !strings.Contains(out, "egress fence loaded: 3 subnets and resolvers") {
			t.Errorf("output %q", out)
		}
	})
	t.Run("NoAddress", func(t *testing.T) {
		r := newFenceRun(t, -1, 0)
		code, out := r.run(t)
		if code != fenceNoAddressExit {
			t.Fatalf("exit %d, want %d:\n%s", code, fenceNoAddressExit, out)
		}
		if !exists(t, r.marker) {
			t.Errorf("no marker %s: the retry unit's condition would not hold", r.marker)
		}
		if n := r.calls(t, "nft"); len(n) != 0 {
			t.Errorf("nft ran without an address: %q", n)
		}
		if got := len(r.calls(t, "sleep")); got != 120 {
			t.Errorf("%d waits of 0.5 s, want 120 (60 s)", got)
		}
		if !strings.Contains(out, "no global address after 60 s") {
			t.Errorf("output %q does not say why", out)
		}
	})
	t.Run("NftFails", func(t *testing.T) {
		r := newFenceRun(t, 0, 1)
		code, out := r.run(t)
		if code == 0 || code == fenceNoAddressExit {
			t.Fatalf("exit %d, want nft's failure (neither 0 nor %d):\n%s", code, fenceNoAddressExit, out)
		}
		if exists(t, r.marker) {
			t.Errorf("marker %s left after a failure waiting cannot mend", r.marker)
		}
	})
	t.Run("Retry", func(t *testing.T) {
		r := newFenceRun(t, 4, 0)
		code, out := r.run(t, "retry")
		if code != 0 {
			t.Fatalf("exit %d, want 0:\n%s", code, out)
		}
		if diff := cmp.Diff([]string{"systemctl --no-block start tinyproxy.service"}, r.calls(t, "systemctl")); diff != "" {
			t.Errorf("systemctl calls (-want +got):\n%s", diff)
		}
		if got := len(r.calls(t, "sleep")); got != 4 {
			t.Errorf("%d waits, want 4 (one per check without an address)", got)
		}
		if n := r.calls(t, "nft"); len(n) != 0 {
			t.Errorf("the retry loaded the fence itself (%q): tinyproxy's own start does", n)
		}
	})
}

// setElements are the elements the ruleset gives its set name.
func setElements(t *testing.T, rules, name string) []string {
	t.Helper()
	_, body, ok := strings.Cut(rules, "\tset "+name+" {\n")
	if !ok {
		t.Fatalf("the ruleset has no set %s:\n%s", name, rules)
	}
	body, _, _ = strings.Cut(body, "\t}\n")
	_, elems, ok := strings.Cut(body, "elements = { ")
	if !ok {
		return nil
	}
	elems, _, _ = strings.Cut(elems, " }")
	return strings.Split(elems, ", ")
}

// The clouds' metadata servers are refused whatever allowedDestinations open, IPv6 ones
// too: an exception for fd00::/8 (a VPC's unique-local range) must not reach GCE's.
func TestFenceRefusesMetadataServers(t *testing.T) {
	allowed := []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("fc00::/7")}
	rules := fenceRuleset(allowed)
	for _, tc := range []struct{ cloud, addr, set string }{
		{"GCE, AWS, Azure, OpenStack", "169.254.169.254", "metadata4"},
		{"Alibaba Cloud", "100.100.100.200", "metadata4"},
		{"AWS over IPv6", "fd00:ec2::254", "metadata6"},
		{"GCE over IPv6", "fd20:ce::254", "metadata6"},
	} {
		a := netip.MustParseAddr(tc.addr)
		if !slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
			t.Fatalf("%s: the test's exceptions do not cover %s", tc.cloud, a)
		}
		if !slices.Contains(setElements(t, rules, tc.set), tc.addr) {
			t.Errorf("%s's metadata server %s is not in the set %s, refused before any exception:\n%s", tc.cloud, tc.addr, tc.set, rules)
		}
	}
	for _, fam := range []string{"ip daddr @metadata4", "ip6 daddr @metadata6"} {
		m, a := strings.Index(rules, fam+" goto refuse"), strings.Index(rules, "daddr @allowed")
		if m < 0 || a < 0 || m > a {
			t.Errorf("%s is not refused before the exceptions are looked at:\n%s", fam, rules)
		}
	}
}

// The fence refuses every on-link route of the guest (one without a gateway), whatever
// put it there: the kernel for an address's prefix, DHCP, a static route, and router
// advertisements (systemd-networkd installs an on-link prefix as proto ra, the kernel as
// proto kernel). Routes through a gateway, the default, and blackholes are not the
// guest's subnets. The listings are shaped like iproute2's, as a network namespace
// printed them.
func TestFenceOwnSubnets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes map[string]string
		want   []string // own4/own6 elements
	}{
		{"IPv6 on-link prefix from a router advertisement (networkd)", map[string]string{"6": "2001:db8:7::/64 dev enp1s0 proto ra metric 1024 expires 86391sec pref medium\\n" +
			"fe80::/64 dev enp1s0 proto kernel metric 256 pref medium\\n" +
			"default via fe80::1 dev enp1s0 proto ra metric 1024 expires 1791sec pref medium"},
			[]string{"own6 { 2001:db8:7::/64 }", "own6 { fe80::/64 }"}},
		{"IPv6 of every origin", map[string]string{"6": "2001:db8:7::/64 dev enp1s0 proto kernel metric 256 expires 86391sec pref medium\\n" +
			"2001:db8:8::/64 dev enp1s0 proto static metric 1024 pref medium\\n" +
			"2001:db8:9::/64 dev enp1s0 proto dhcp metric 1024 pref medium\\n" +
			"2001:db8:a::/64 dev enp1s0 proto boot metric 1024 pref medium\\n" +
			"2001:db8:b::5 dev enp1s0 proto ra metric 1024 pref medium"},
			[]string{"own6 { 2001:db8:7::/64 }", "own6 { 2001:db8:8::/64 }", "own6 { 2001:db8:9::/64 }", "own6 { 2001:db8:a::/64 }", "own6 { 2001:db8:b::5 }"}},
		{"IPv6 routes not on-link", map[string]string{"6": "2001:db8:99::/48 via fd00:7::1 dev enp1s0 proto ra metric 1024 pref medium\\n" +
			"2001:db8:aa::/64 proto ra metric 1024 pref medium nexthop via fd00:7::1 dev enp1s0 weight 1 nexthop via fd00:7::2 dev enp1s0 weight 1\\n" +
			"unreachable 2001:db8:dead::/48 dev lo metric 1024 pref medium\\n" +
			"default via fd00:7::1 dev enp1s0 proto ra metric 1024 pref medium"},
			nil},
		{"IPv4 on-link of every origin and scope", map[string]string{"4": "default via 10.123.0.1 dev enp1s0 proto dhcp src 10.123.0.50 metric 1024\\n" +
			"10.123.0.0/24 dev enp1s0 proto kernel scope link src 10.123.0.50 metric 1024\\n" +
			"192.168.5.0/24 dev enp1s0 proto dhcp scope link src 192.168.5.7 metric 1024\\n" +
			"198.51.100.0/24 dev enp1s0\\n" +
			"10.200.0.0/16 via 10.123.0.1 dev enp1s0\\n" +
			"blackhole 10.99.0.0/16"},
			[]string{"own4 { 10.123.0.0/24 }", "own4 { 192.168.5.0/24 }", "own4 { 198.51.100.0/24 }"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFenceRunRoutes(t, 0, 0, tc.routes)
			if code, out := r.run(t); code != 0 {
				t.Fatalf("exit %d, want 0:\n%s", code, out)
			}
			loaded, err := os.ReadFile(filepath.Join(r.dir, "loaded.nft"))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range strings.Split(string(loaded), "\n") {
				if e, ok := strings.CutPrefix(l, "add element "+FenceTable+" "); ok && strings.HasPrefix(e, "own") {
					got = append(got, e)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("the guest's subnets the fence refuses (-want +got):\n%s", diff)
			}
		})
	}
}
