package kvm2

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

// racer is one side of a race for a domain name: a provider (an install) and the request
// it makes, with a cloud-init of its own so its seed can be told apart.
type racer struct {
	who     string
	p       *Provider
	install string
	req     provider.CreateRequest
}

// raceResult is what one racer's Create returned.
type raceResult struct {
	inst provider.Instance
	err  error
}

// createAsync runs r's Create in its own goroutine and returns where its result arrives.
func createAsync(t *testing.T, r racer) <-chan raceResult {
	t.Helper()
	out := make(chan raceResult, 1)
	go func() {
		inst, err := r.p.Create(t.Context(), r.req)
		out <- raceResult{inst, err}
	}()
	return out
}

// await receives r's result, or fails the test naming what it waited for.
func await(t *testing.T, what string, ch <-chan raceResult) raceResult {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(waitLong):
		t.Fatalf("gave up after %s waiting for %s", waitLong, what)
		return raceResult{}
	}
}

// awaitGate waits until a call has reached g.
func awaitGate(t *testing.T, what string, g *libvirtfake.Gate) {
	t.Helper()
	select {
	case <-g.Entered():
	case <-time.After(waitLong):
		t.Fatalf("gave up after %s waiting for %s", waitLong, what)
	}
}

// TestTwoInstallsRaceForOneName: two installs (or two owners in one install) create the
// same domain name on one host at the same moment, stopped by the fake's gates at the
// steps where the interleaving matters and let go in both orders. Exactly one wins; the
// winner's VM boots the winner's seed on the winner's overlay; the loser reports the
// winner's mark with the class the ownership rules give it, and deletes, creates and
// writes no volume. Each side's Delete then does what the mark says: the loser's leaves
// the winner's VM alone, the winner's removes it all.
func TestTwoInstallsRaceForOneName(t *testing.T) {
	owners := []struct {
		name               string
		installA, installB string
		// cause is what the loser's permanent error wraps besides its class; wantLoser
		// is its message for winner w.
		cause     error
		wantLoser func(name string, w racer) string
	}{
		{
			name: "two installs", installA: "install-a", installB: "install-b",
			wantLoser: func(name string, w racer) string {
				return "domain " + name + " on host h1 belongs to install " + w.install + ", not to this one"
			},
		},
		{
			name: "one install, two UIDs", installA: "install-a", installB: "install-a",
			cause: provider.ErrOwnedByOther,
			wantLoser: func(name string, w racer) string {
				return "domain " + name + " on host h1 belongs to UID " + w.req.UID + ", not to UID "
			},
		},
	}
	// Each interleaving runs the race with racer first ahead, which must win.
	interleavings := []struct {
		name  string
		first int
		run   func(t *testing.T, f *libvirtfake.Fake, r [2]racer, first int) [2]raceResult
	}{
		// Both looked the name up and found nothing; both define, first ahead.
		{"both past the lookup, a defines first", 0, bothPastLookup},
		{"both past the lookup, b defines first", 1, bothPastLookup},
		// first is stopped at its first volume call; the other runs all the way meanwhile.
		{"b arrives while a builds its disks", 0, arrivesWhileBuilding},
		{"a arrives while b builds its disks", 1, arrivesWhileBuilding},
	}
	const name = "proxy-0d0d0d0d0d0d0d0d"
	for _, typ := range bothTypes {
		for _, o := range owners {
			for _, il := range interleavings {
				t.Run(typ+"/"+o.name+"/"+il.name, func(t *testing.T) {
					env := newTestEnv(t)
					f := env.fake
					var r [2]racer
					for i, in := range []string{o.installA, o.installB} {
						who := []string{"a", "b"}[i]
						req := testRequest(name)
						req.UID = "uid-" + who
						req.SpecHash = "hash-" + who
						req.CloudInit = []byte("#cloud-config\nchpasswd: {list: 'root:password-of-" + who + "'}\n")
						r[i] = racer{who: who, p: env.beside(t, typ, "home", WithInstallID(in)), install: in, req: req}
					}
					f.ResetCalls()
					w := il.first
					res := il.run(t, f, r, w)
					l := 1 - w
					winner, loser := r[w], r[l]

					// What is on the host first: whoever the mark names must be who built
					// the disks, whichever side that is.
					wantBuiltBy(t, f, typ, r, w)
					if n := f.Calls("StorageVolDelete"); n != 0 {
						t.Errorf("%d volumes deleted during the race; neither side had anything to delete", n)
					}
					if n := f.Calls("StorageVolCreateXML"); n != 2 {
						t.Errorf("%d volumes created, want the winner's overlay and seed only", n)
					}
					if res[w].err != nil {
						t.Fatalf("winner %s: %v", winner.who, res[w].err)
					}
					msg := o.wantLoser(name, winner)
					wantClass(t, res[l].err, provider.ErrPermanent, o.cause)
					if !strings.Contains(res[l].err.Error(), msg) {
						t.Fatalf("loser %s: %q does not say %q", loser.who, res[l].err, msg)
					}
					if o.installA != o.installB && errors.Is(res[l].err, provider.ErrOwnedByOther) {
						t.Fatalf("loser %s: another install's VM is marked as clearing by itself: %v", loser.who, res[l].err)
					}
					if t.Failed() {
						return
					}

					// The loser's Delete leaves the winner's VM and volumes as they are.
					if err := loser.p.Delete(t.Context(), ident.ProviderID("h1", name)); err != nil {
						t.Fatalf("loser's delete: %v", err)
					}
					if o.installA != o.installB {
						wantBuiltBy(t, f, typ, r, w)
					}
					// The winner's Delete removes all of it.
					if err := winner.p.Delete(t.Context(), res[w].inst.ProviderID); err != nil {
						t.Fatalf("winner's delete: %v", err)
					}
					if _, ok := f.Domain(name); ok {
						t.Errorf("domain %s survived its owner's delete", name)
					}
					for _, vol := range []string{overlayVolName(name), seedVolName(name)} {
						if _, ok := f.Volume(libvirtfake.DefaultPool, vol); ok {
							t.Errorf("volume %s survived its owner's delete", vol)
						}
					}
				})
			}
		}
	}
}

// bothPastLookup stops both racers at their first domain definition, so both have
// looked the name up and found nothing, and lets racer first define before the other.
func bothPastLookup(t *testing.T, f *libvirtfake.Fake, r [2]racer, first int) [2]raceResult {
	t.Helper()
	gates := [2]*libvirtfake.Gate{f.BlockNext("DomainDefineXMLFlags"), f.BlockNext("DomainDefineXMLFlags")}
	for _, g := range gates {
		defer g.Release()
	}
	var ch [2]<-chan raceResult
	for i := range r {
		ch[i] = createAsync(t, r[i])
		awaitGate(t, r[i].who+"'s first domain definition", gates[i])
	}
	var res [2]raceResult
	for _, i := range []int{first, 1 - first} {
		gates[i].Release()
		res[i] = await(t, r[i].who+"'s create", ch[i])
	}
	return res
}

// arrivesWhileBuilding stops racer first at its first volume call and runs the other's
// Create to the end meanwhile, then lets the first go on.
func arrivesWhileBuilding(t *testing.T, f *libvirtfake.Fake, r [2]racer, first int) [2]raceResult {
	t.Helper()
	g := f.BlockNext("StorageVolCreateXML")
	defer g.Release()
	var res [2]raceResult
	ch := createAsync(t, r[first])
	awaitGate(t, r[first].who+"'s first volume call", g)
	res[1-first] = await(t, r[1-first].who+"'s create", createAsync(t, r[1-first]))
	g.Release()
	res[first] = await(t, r[first].who+"'s create", ch)
	return res
}

// wantBuiltBy checks the domain of the race: running, its disks the name's overlay and
// seed, the seed holding the cloud-init of the racer its mark names and none of the
// other's, and that racer r[want].
func wantBuiltBy(t *testing.T, f *libvirtfake.Fake, typ string, r [2]racer, want int) {
	t.Helper()
	name := r[want].req.Name
	d, ok := f.Domain(name)
	if !ok {
		t.Fatalf("no domain %s", name)
	}
	if d.State != libvirt.DomainRunning {
		t.Errorf("domain %s is %v, want running", name, d.State)
	}
	m := markOf(t, f, typ, name)
	owner := -1
	for i := range r {
		if m.Install == r[i].install && m.UID == r[i].req.UID && m.SpecHash == r[i].req.SpecHash {
			owner = i
		}
	}
	if owner < 0 {
		t.Fatalf("domain %s is marked %+v, by neither side", name, m)
	}
	if owner != want {
		t.Errorf("domain %s is %s's, want %s's", name, r[owner].who, r[want].who)
	}
	overlay, ok := f.Volume(libvirtfake.DefaultPool, overlayVolName(name))
	if !ok {
		t.Fatalf("no overlay %s", overlayVolName(name))
	}
	seed, ok := f.Volume(libvirtfake.DefaultPool, seedVolName(name))
	if !ok {
		t.Fatalf("no seed %s", seedVolName(name))
	}
	for _, path := range []string{overlay.Path, seed.Path} {
		if !strings.Contains(d.XML, fmt.Sprintf("file=%q", path)) {
			t.Errorf("domain %s does not use %s", name, path)
		}
	}
	w, l := r[owner], r[1-owner]
	if !bytes.Contains(seed.Content, w.req.CloudInit) {
		t.Errorf("seed of %s does not hold the cloud-init of %s, its owner", name, w.who)
	}
	if bytes.Contains(seed.Content, l.req.CloudInit) {
		t.Errorf("seed of %s, owned by %s, holds %s's cloud-init (password and all)", name, w.who, l.who)
	}
}

// TestDeleteOfLeftOversRacesACreate: a Delete that finds volumes of its name without a
// domain (left by an earlier release's interrupted Create) races a Create of another
// install for that name, in both orders. The Delete removes volumes only while it holds
// the name's claim, so it never deletes the disks of the Create's VM; the Create never
// builds under the Delete's claim, and goes through once the Delete is done.
func TestDeleteOfLeftOversRacesACreate(t *testing.T) {
	const name = "proxy-0e0e0e0e0e0e0e0e"
	setup := func(t *testing.T) (*libvirtfake.Fake, [2]racer) {
		env := newTestEnv(t)
		var r [2]racer
		for i, who := range []string{"a", "b"} {
			req := testRequest(name)
			req.UID = "uid-" + who
			req.CloudInit = []byte("#cloud-config\nchpasswd: {list: 'root:password-of-" + who + "'}\n")
			r[i] = racer{who: who, p: env.beside(t, provider.TypeKVM2, "home", WithInstallID("install-"+who)),
				install: "install-" + who, req: req}
		}
		putLeftOvers(t, env.fake, name)
		return env.fake, r
	}
	deleteAsync := func(p *Provider) <-chan error {
		out := make(chan error, 1)
		go func() { out <- p.Delete(t.Context(), ident.ProviderID("h1", name)) }()
		return out
	}
	awaitErr := func(t *testing.T, what string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(waitLong):
			t.Fatalf("gave up after %s waiting for %s", waitLong, what)
			return nil
		}
	}

	t.Run("a create claims while the delete looks at the volumes", func(t *testing.T) {
		f, r := setup(t)
		g := f.BlockNext("StorageVolLookupByName")
		defer g.Release()
		del := deleteAsync(r[1].p)
		awaitGate(t, "b's delete looking up the left-over volumes", g)
		res := await(t, "a's create", createAsync(t, r[0]))
		if res.err != nil {
			t.Fatalf("a's create: %v", res.err)
		}
		g.Release()
		err := awaitErr(t, "b's delete", del)
		// a's VM first: b's delete must have left its disks alone.
		wantBuiltBy(t, f, provider.TypeKVM2, r, 0)
		wantClass(t, err, provider.ErrTransient, nil)
		if !strings.Contains(err.Error(), "was defined while its left-over volumes were to be removed") {
			t.Fatalf("b's delete: %v", err)
		}
		// The retry finds a's domain and leaves it alone.
		if err := r[1].p.Delete(t.Context(), ident.ProviderID("h1", name)); err != nil {
			t.Fatalf("b's second delete: %v", err)
		}
		wantBuiltBy(t, f, provider.TypeKVM2, r, 0)
	})

	t.Run("a create arrives while the delete removes the volumes", func(t *testing.T) {
		f, r := setup(t)
		g := f.BlockNext("StorageVolDelete")
		defer g.Release()
		del := deleteAsync(r[1].p)
		awaitGate(t, "b's delete removing the left-over volumes", g)
		res := await(t, "a's create", createAsync(t, r[0]))
		g.Release()
		if err := awaitErr(t, "b's delete", del); err != nil {
			t.Fatalf("b's delete: %v", err)
		}
		if res.err == nil {
			// Built while b's delete was removing volumes of the name: see what is left.
			wantBuiltBy(t, f, provider.TypeKVM2, r, 0)
			t.Fatal("a's create went through while b's delete held the name")
		}
		wantClass(t, res.err, provider.ErrTransient, nil)
		if want := "domain " + name + " on host h1 is a claim held while volumes of that name are removed"; !strings.Contains(res.err.Error(), want) {
			t.Fatalf("a's create: %q does not say %q", res.err, want)
		}
		if _, ok := f.Domain(name); ok {
			t.Fatal("b's claim outlived its delete")
		}
		// The retry builds a's VM.
		if _, err := r[0].p.Create(t.Context(), r[0].req); err != nil {
			t.Fatalf("a's second create: %v", err)
		}
		wantBuiltBy(t, f, provider.TypeKVM2, r, 0)
	})
}

// TestClaimLostToTheSameOwnerIsTransient: two processes of one install creating the same
// Proxy (same UID and spec) race past the lookup; the one whose claim loses answers
// transient, and its retry adopts the VM the other built.
func TestClaimLostToTheSameOwnerIsTransient(t *testing.T) {
	env := newTestEnv(t)
	const name = "proxy-0f0f0f0f0f0f0f0f"
	req := testRequest(name)
	req.SpecHash = "hash-1"
	var r [2]racer
	for i, who := range []string{"a", "b"} {
		r[i] = racer{who: who, p: env.beside(t, provider.TypeKVM2, "home", WithInstallID("install-a")), install: "install-a", req: req}
	}
	res := bothPastLookup(t, env.fake, r, 0)
	if res[0].err != nil {
		t.Fatalf("a: %v", res[0].err)
	}
	wantClass(t, res[1].err, provider.ErrTransient, nil)
	if want := "domain " + name + " on host h1 was defined by another call of this install meanwhile; trying again"; res[1].err.Error() != want {
		t.Fatalf("b: %q, want %q", res[1].err, want)
	}
	inst, err := r[1].p.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("b's retry: %v", err)
	}
	if inst.ProviderID != res[0].inst.ProviderID || stateOf(env.fake, name) != libvirt.DomainRunning {
		t.Fatalf("b's retry got %+v, want a's running VM adopted", inst)
	}
}
