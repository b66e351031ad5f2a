//go:build integration

package kvm2

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// TestKVM2TwoInstallsRaceForOneName_realHost: two installs create the same domain name on
// the real host at the same moment, a few rounds over. Each round exactly one wins; the
// loser fails permanently naming the winner's install, and the winner's domain boots the
// winner's seed: the seed volume libvirtd holds carries the winner's cloud-init and none
// of the loser's. Then the define collision itself (the loser's claim meeting the
// winner's domain, which the concurrent rounds may or may not reach) and a Delete that
// removes volumes left without a domain under a claim of its own.
func TestKVM2TwoInstallsRaceForOneName_realHost(t *testing.T) {
	e := itNewRealEnv(t, "race")
	t.Cleanup(e.removeImage)
	ps := map[string]*Provider{
		"install-a": e.newProvider(itEnvOptions{diskSizeGb: 1, installID: "install-a"}),
		"install-b": e.newProvider(itEnvOptions{diskSizeGb: 1, installID: "install-b"}),
	}
	// The base image first, so the rounds race on the name and not on the download.
	warm := e.request(e.names.vm(0), "uid-warm")
	inst, err := createSettled(itCtxFor(t), ps["install-a"], warm)
	if err != nil {
		t.Fatalf("warm-up create: %v", err)
	}
	if err := ps["install-a"].Delete(itCtxFor(t), inst.ProviderID); err != nil {
		t.Fatalf("warm-up delete: %v", err)
	}

	requestOf := func(name, install string) provider.CreateRequest {
		req := e.request(name, "uid-"+install)
		req.CloudInit = []byte("#cloud-config\nchpasswd: {list: 'root:password-of-" + install + "'}\n")
		return req
	}
	wins := map[string]int{}
	for round := 1; round <= 3; round++ {
		name := e.names.vm(round)
		var wg sync.WaitGroup
		start := make(chan struct{})
		res := map[string]error{}
		insts := map[string]provider.Instance{}
		var mu sync.Mutex
		for install, p := range ps {
			wg.Go(func() {
				<-start
				inst, err := createSettled(itCtxFor(t), p, requestOf(name, install))
				mu.Lock()
				defer mu.Unlock()
				res[install], insts[install] = err, inst
			})
		}
		close(start)
		wg.Wait()
		var winner, loser string
		switch {
		case res["install-a"] == nil && res["install-b"] != nil:
			winner, loser = "install-a", "install-b"
		case res["install-b"] == nil && res["install-a"] != nil:
			winner, loser = "install-b", "install-a"
		default:
			t.Fatalf("round %d: want exactly one winner, got install-a: %v; install-b: %v", round, res["install-a"], res["install-b"])
		}
		wins[winner]++
		t.Logf("round %d: %s won; %s got: %v", round, winner, loser, res[loser])
		itWantErr(t, res[loser], provider.ErrPermanent,
			"domain "+name+" on host "+integrationHost+" belongs to install "+winner+", not to this one")
		e.wantSeedOf(t, name, requestOf(name, winner), requestOf(name, loser))
		if m := itMarkOf(t, name); m.Install != winner || m.Building {
			t.Fatalf("round %d: domain %s is marked %+v, want %s's finished mark", round, name, m, winner)
		}
		// The loser's Delete leaves the winner's VM running; the winner's removes it all.
		if err := ps[loser].Delete(itCtxFor(t), ident.ProviderID(integrationHost, name)); err != nil {
			t.Fatalf("round %d: the loser's delete: %v", round, err)
		}
		if s := itDomState(t, name); s != "running" {
			t.Fatalf("round %d: the winner's domain is %q after the loser's delete", round, s)
		}
		e.wantSeedOf(t, name, requestOf(name, winner), requestOf(name, loser))
		if err := ps[winner].Delete(itCtxFor(t), insts[winner].ProviderID); err != nil {
			t.Fatalf("round %d: the winner's delete: %v", round, err)
		}
		if itHasDomain(name) || e.hasVolume(overlayVolName(name)) || e.hasVolume(seedVolName(name)) {
			t.Fatalf("round %d: %s or its volumes outlived the winner's delete", round, name)
		}
	}
	t.Logf("wins over 3 rounds: %v", wins)

	t.Run("the loser's claim meets the winner's domain", func(t *testing.T) {
		name := e.names.vm(7)
		a, b := ps["install-a"], ps["install-b"]
		inst, err := createSettled(itCtxFor(t), a, requestOf(name, "install-a"))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		// b's claim, as if its lookup had found nothing: libvirtd refuses the second
		// definition of the name, and b reads a's mark.
		plan, err := b.plan(requestOf(name, "install-b"))
		if err != nil {
			t.Fatal(err)
		}
		bk, err := b.hosts.pooled(itCtxFor(t), integrationHost)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.claimForCreate(itTestLogger(t), bk, plan, ident.Mark{UID: "uid-install-b", Install: "install-b"})
		itWantErr(t, err, provider.ErrPermanent,
			"domain "+name+" on host "+integrationHost+" belongs to install install-a, not to this one")
		e.wantSeedOf(t, name, requestOf(name, "install-a"), requestOf(name, "install-b"))
		if err := a.Delete(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("delete: %v", err)
		}
	})

	t.Run("a delete removes volumes left without a domain", func(t *testing.T) {
		name := e.names.vm(8)
		for _, vol := range []string{overlayVolName(name), seedVolName(name)} {
			itMustVirsh(t, "vol-create-as", e.host.pool, vol, "1M", "--format", "raw")
		}
		if err := ps["install-b"].Delete(itCtxFor(t), ident.ProviderID(integrationHost, name)); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if itHasDomain(name) || e.hasVolume(overlayVolName(name)) || e.hasVolume(seedVolName(name)) {
			t.Fatalf("the claim of %s or its left-over volumes outlived the delete", name)
		}
	})
}

// itMarkOf reads the kvm2 mark of domain name with virsh.
func itMarkOf(t *testing.T, name string) ident.Mark {
	t.Helper()
	m, err := ident.ParseMark(metadataURI, itMustVirsh(t, "metadata", name, "--uri", metadataURI))
	if err != nil {
		t.Fatalf("mark of %s: %v", name, err)
	}
	return m
}

// wantSeedOf checks that domain name uses its overlay and seed, and that the seed libvirtd
// holds carries w's cloud-init and none of l's.
func (e *itRealEnv) wantSeedOf(t *testing.T, name string, w, l provider.CreateRequest) {
	t.Helper()
	xml := itMustVirsh(t, "dumpxml", name)
	for _, vol := range []string{overlayVolName(name), seedVolName(name)} {
		path := strings.TrimSpace(itMustVirsh(t, "vol-path", "--pool", e.host.pool, vol))
		if !strings.Contains(xml, "'"+path+"'") && !strings.Contains(xml, `"`+path+`"`) {
			t.Fatalf("domain %s does not use %s", name, path)
		}
	}
	f := filepath.Join(t.TempDir(), "seed.iso")
	itMustVirsh(t, "vol-download", "--pool", e.host.pool, seedVolName(name), f)
	seed, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(seed, w.CloudInit) {
		t.Fatalf("seed of %s does not hold its owner's cloud-init", name)
	}
	if bytes.Contains(seed, l.CloudInit) {
		t.Fatalf("seed of %s holds the other install's cloud-init", name)
	}
}
