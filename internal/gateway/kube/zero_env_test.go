package kube

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// A ProxyPool with no published proxy is known to the Chooser: an *EmptyPoolError naming
// its namespace, with or without ns, for an identity that may use the namespace; a pool
// that does not exist, or one in a namespace the identity may not use, stays unknown; a
// pool at spec.replicas 0 without spec.autoscaling, which nothing would start a child of,
// is not held for: a plain ErrNoExit saying so. Creating the pool wakes what WakeOn
// registered.
func TestChooseKnowsAPoolAtZero(t *testing.T) {
	e := startGateway(t, nil)
	woken := make(chan struct{}, 100)
	e.a.WakeOn(func() { woken <- struct{}{} })
	for len(woken) > 0 { // what came before the pool
		<-woken
	}
	if err := e.env.Client.Create(e.ctx, testbuild.Pool(e.nsA, "news", 0, testbuild.Managed(), testbuild.WithProvider("fake"),
		testbuild.Autoscaled(0, 3, 10))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-e.ctx.Done():
		t.Fatal("creating the pool woke nobody")
	}
	mayA := gateway.Identity{Name: "crawler", Namespaces: []string{e.nsA}}
	mayB := gateway.Identity{Name: "other", Namespaces: []string{e.nsB}}
	for _, c := range []struct {
		what string
		req  gateway.ChoiceRequest
	}{
		{"with ns", gateway.ChoiceRequest{Identity: mayA, Namespace: e.nsA, Pool: "news"}},
		{"without ns", gateway.ChoiceRequest{Identity: mayA, Pool: "news"}},
	} {
		var empty *gateway.EmptyPoolError
		testutil.WaitFor(t, testutil.WaitLong, "the pool at zero in the cache ("+c.what+")", func() (bool, error) {
			_, err := e.a.Choose(e.ctx, c.req)
			return errors.As(err, &empty), err
		})
		if empty.Namespace != e.nsA || empty.Pool != "news" || !errors.Is(empty, gateway.ErrNoExit) {
			t.Errorf("%s: %+v, want pool %s/news, an ErrNoExit", c.what, empty, e.nsA)
		}
	}
	if err := e.env.Client.Create(e.ctx, testbuild.Pool(e.nsA, "idle", 0, testbuild.Managed(), testbuild.WithProvider("fake"))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, testutil.WaitLong, "the idle pool at zero in the cache, refused without a hold", func() (bool, error) {
		_, err := e.a.Choose(e.ctx, gateway.ChoiceRequest{Identity: mayA, Pool: "idle"})
		var empty *gateway.EmptyPoolError
		return errors.Is(err, gateway.ErrNoExit) && !errors.As(err, &empty) &&
			strings.Contains(fmt.Sprint(err), "spec.replicas 0 and no spec.autoscaling"), err
	})
	for _, c := range []struct {
		what string
		req  gateway.ChoiceRequest
	}{
		{"a pool that does not exist", gateway.ChoiceRequest{Identity: mayA, Pool: "nope"}},
		{"a namespace the identity may not use", gateway.ChoiceRequest{Identity: mayB, Pool: "news"}},
	} {
		if _, err := e.a.Choose(e.ctx, c.req); !errors.Is(err, gateway.ErrUnknownPool) {
			t.Errorf("%s: %v, want ErrUnknownPool", c.what, err)
		}
	}
}
