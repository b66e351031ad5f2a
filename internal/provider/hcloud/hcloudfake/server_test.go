package hcloudfake

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// fake starts a fake and the official client on it, polling and retrying every
// millisecond so that tests wait on calls, not on time.
func fake(t *testing.T, opts ...hcloud.ClientOption) (*Server, *hcloud.Client) {
	t.Helper()
	s := New()
	t.Cleanup(s.Close)
	return s, client(s, Token, opts...)
}

func client(s *Server, token string, opts ...hcloud.ClientOption) *hcloud.Client {
	return hcloud.NewClient(append([]hcloud.ClientOption{
		hcloud.WithEndpoint(s.URL), hcloud.WithToken(token),
		hcloud.WithPollOpts(hcloud.PollOpts{BackoffFunc: hcloud.ConstantBackoff(time.Millisecond)}),
		hcloud.WithRetryOpts(hcloud.RetryOpts{BackoffFunc: hcloud.ConstantBackoff(time.Millisecond), MaxRetries: 5}),
	}, opts...)...)
}

func create(t *testing.T, c *hcloud.Client, name string, labels map[string]string) (hcloud.ServerCreateResult, error) {
	t.Helper()
	res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{
		Name: name, ServerType: &hcloud.ServerType{Name: "cx23"}, Image: &hcloud.Image{Name: "debian-13"},
		Location: &hcloud.Location{Name: "fsn1"}, Labels: labels, UserData: "#cloud-config\n",
		PublicNet: &hcloud.ServerCreatePublicNet{EnableIPv4: true, EnableIPv6: true},
	})
	return res, err
}

func mustCreate(t *testing.T, c *hcloud.Client, name string, labels map[string]string) *hcloud.Server {
	t.Helper()
	res, err := create(t, c, name, labels)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	if err := c.Action.WaitFor(t.Context(), append([]*hcloud.Action{res.Action}, res.NextActions...)...); err != nil {
		t.Fatalf("create %s: actions: %v", name, err)
	}
	return res.Server
}

// TestServerGoesInitializingStartingRunning: a create answers an initializing server, a
// running create_server and a start_server next action; reads move the server to
// starting, then running, with a primary IPv4 and an IPv6 /64.
func TestServerGoesInitializingStartingRunning(t *testing.T) {
	_, c := fake(t)
	res, err := create(t, c, "proxy-1", map[string]string{"install": "a"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Server.Status != hcloud.ServerStatusInitializing || res.Action.Command != "create_server" || res.Action.Status != hcloud.ActionStatusRunning ||
		len(res.NextActions) != 1 || res.NextActions[0].Command != "start_server" || res.RootPassword == "" {
		t.Fatalf("create answered %+v, action %+v, next %v", res.Server, res.Action, res.NextActions)
	}
	var seen []hcloud.ServerStatus
	for i := 0; i < 10; i++ {
		sv, _, err := c.Server.GetByID(t.Context(), res.Server.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) == 0 || seen[len(seen)-1] != sv.Status {
			seen = append(seen, sv.Status)
		}
		if sv.Status == hcloud.ServerStatusRunning {
			if sv.PublicNet.IPv4.IP.String() != "203.0.113.1" || sv.PublicNet.IPv6.Network.String() != "2001:db8:1::/64" || sv.Locked {
				t.Errorf("running server: ipv4 %v, ipv6 %v, locked %v", sv.PublicNet.IPv4.IP, sv.PublicNet.IPv6.Network, sv.Locked)
			}
			break
		}
	}
	want := []hcloud.ServerStatus{hcloud.ServerStatusInitializing, hcloud.ServerStatusStarting, hcloud.ServerStatusRunning}
	if strings.Join(statuses(seen), ",") != strings.Join(statuses(want), ",") {
		t.Errorf("statuses %v, want %v", seen, want)
	}
}

func statuses(s []hcloud.ServerStatus) []string {
	var out []string
	for _, x := range s {
		out = append(out, string(x))
	}
	return out
}

func apiErr(t *testing.T, err error) hcloud.Error {
	t.Helper()
	var he hcloud.Error
	if !errors.As(err, &he) {
		t.Fatalf("not a hcloud.Error: %v", err)
	}
	return he
}

// TestStartAfterCreateFalseStaysOff: a server created without start is "off" once its
// create_server finishes, and poweron brings it to "running".
func TestStartAfterCreateFalseStaysOff(t *testing.T) {
	_, c := fake(t)
	res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{Name: "cold", ServerType: &hcloud.ServerType{Name: "cpx22"},
		Image: &hcloud.Image{Name: "ubuntu-24.04"}, Location: &hcloud.Location{Name: "ash"}, StartAfterCreate: hcloud.Ptr(false)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NextActions) != 0 {
		t.Errorf("next actions %v without start", res.NextActions)
	}
	if err := c.Action.WaitFor(t.Context(), res.Action); err != nil {
		t.Fatal(err)
	}
	sv, _, err := c.Server.GetByID(t.Context(), res.Server.ID)
	if err != nil || sv.Status != hcloud.ServerStatusOff {
		t.Fatalf("after create: %v, %v", sv, err)
	}
	a, _, err := c.Server.Poweron(t.Context(), sv)
	if err != nil || a.Command != "start_server" {
		t.Fatalf("poweron: %v, %v", a, err)
	}
	if err := c.Action.WaitFor(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if sv, _, _ = c.Server.GetByID(t.Context(), sv.ID); sv.Status != hcloud.ServerStatusRunning {
		t.Errorf("after poweron: %s", sv.Status)
	}
}

// TestPowerActions: each power action answers its command and leaves the state the real
// API leaves; the server's actions are polled through GET /actions?id=.
func TestPowerActions(t *testing.T) {
	s, c := fake(t)
	sv := mustCreate(t, c, "power", nil)
	for _, step := range []struct {
		do      func(context.Context, *hcloud.Server) (*hcloud.Action, *hcloud.Response, error)
		command string
		status  hcloud.ServerStatus
	}{
		{c.Server.Reboot, "reboot_server", hcloud.ServerStatusRunning},
		{c.Server.Reset, "reset_server", hcloud.ServerStatusRunning},
		{c.Server.Shutdown, "shutdown_server", hcloud.ServerStatusOff},
		{c.Server.Poweron, "start_server", hcloud.ServerStatusRunning},
		{c.Server.Poweroff, "stop_server", hcloud.ServerStatusOff},
	} {
		a, _, err := step.do(t.Context(), sv)
		if err != nil || a.Command != step.command || a.Status != hcloud.ActionStatusRunning {
			t.Fatalf("%s: %+v, %v", step.command, a, err)
		}
		if len(a.Resources) != 1 || a.Resources[0].ID != sv.ID || a.Resources[0].Type != hcloud.ActionResourceTypeServer {
			t.Errorf("%s: resources %+v", step.command, a.Resources)
		}
		if err := c.Action.WaitFor(t.Context(), a); err != nil {
			t.Fatal(err)
		}
		got, _, _ := c.Server.GetByID(t.Context(), sv.ID)
		if got.Status != step.status {
			t.Errorf("after %s: %s, want %s", step.command, got.Status, step.status)
		}
	}
	if n := s.CallCount(ActionsList); n < 5 {
		t.Errorf("%d action polls for 5 actions", n)
	}
}

// TestActionFailsAfterAcceptance: an injected ActionCode lets the create through and
// ends its action in error; WaitFor returns the action's error, and the server stays
// "off", to be deleted by the caller. A failed reset leaves the server as it was.
func TestActionFailsAfterAcceptance(t *testing.T) {
	s, c := fake(t)
	s.Fail(ServersCreate, Failure{ActionCode: "placement_error", Message: "no capacity in fsn1"})
	res, err := create(t, c, "doomed", nil)
	if err != nil {
		t.Fatalf("the create itself: %v", err)
	}
	err = c.Action.WaitFor(t.Context(), append([]*hcloud.Action{res.Action}, res.NextActions...)...)
	var ae hcloud.ActionError
	if !errors.As(err, &ae) || ae.Code != "placement_error" || ae.Message != "no capacity in fsn1" {
		t.Fatalf("WaitFor: %v", err)
	}
	a, _, err := c.Action.GetByID(t.Context(), res.Action.ID)
	if err != nil || a.Status != hcloud.ActionStatusError || a.ErrorCode != "placement_error" || a.Finished.IsZero() {
		t.Errorf("action %+v, %v", a, err)
	}
	sv, _, _ := c.Server.GetByID(t.Context(), res.Server.ID)
	if sv == nil || sv.Status != hcloud.ServerStatusOff {
		t.Fatalf("server after a failed create: %+v", sv)
	}
	// The failure was for one call only: the next action succeeds.
	a, _, err = c.Server.Poweron(t.Context(), sv)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Action.WaitFor(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	s.Fail(ServersReset, Failure{ActionCode: "action_failed"})
	a, _, err = c.Server.Reset(t.Context(), sv)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Action.WaitFor(t.Context(), a); !errors.As(err, &ae) || ae.Code != "action_failed" {
		t.Errorf("failed reset: %v", err)
	}
	if sv, _, _ = c.Server.GetByID(t.Context(), sv.ID); sv.Status != hcloud.ServerStatusRunning {
		t.Errorf("after a failed reset: %s", sv.Status)
	}
}

// TestLockedWhileAnActionRuns: a second action on a server whose create still runs is
// 423 locked, and so is its delete; once the actions finished both go through.
func TestLockedWhileAnActionRuns(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(50)
	res, err := create(t, c, "busy", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, resp, err := c.Server.Poweroff(t.Context(), res.Server)
	if !hcloud.IsError(err, hcloud.ErrorCodeLocked) || resp.StatusCode != 423 {
		t.Fatalf("poweroff while creating: %v", err)
	}
	if _, _, err := c.Server.DeleteWithResult(t.Context(), res.Server); !hcloud.IsError(err, hcloud.ErrorCodeLocked) {
		t.Fatalf("delete while creating: %v", err)
	}
	if sv, _, _ := c.Server.GetByID(t.Context(), res.Server.ID); !sv.Locked {
		t.Error("server not shown locked")
	}
	if err := c.Action.WaitFor(t.Context(), append([]*hcloud.Action{res.Action}, res.NextActions...)...); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Server.Poweroff(t.Context(), res.Server); err != nil {
		t.Errorf("poweroff after: %v", err)
	}
}

// TestDeleteServer: DELETE answers a delete_server action; the server is "deleting"
// while it runs and gone after, with its auto-deleted primary IPs and its place in a
// firewall.
func TestDeleteServer(t *testing.T) {
	s, c := fake(t)
	sv := mustCreate(t, c, "gone", nil)
	fw, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "fw",
		ApplyTo: []hcloud.FirewallResource{{Type: hcloud.FirewallResourceTypeServer, Server: &hcloud.FirewallResourceServer{ID: sv.ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Action.WaitFor(t.Context(), fw.Actions...); err != nil {
		t.Fatal(err)
	}
	if n := len(s.PrimaryIPs()); n != 2 {
		t.Fatalf("%d primary IPs for one server", n)
	}
	res, _, err := c.Server.DeleteWithResult(t.Context(), sv)
	if err != nil || res.Action.Command != "delete_server" {
		t.Fatalf("delete: %+v, %v", res, err)
	}
	if got, _ := s.ServerByName("gone"); got.Status != "deleting" {
		t.Errorf("status while deleting: %s", got.Status)
	}
	if err := c.Action.WaitFor(t.Context(), res.Action); err != nil {
		t.Fatal(err)
	}
	got, resp, err := c.Server.GetByID(t.Context(), sv.ID)
	if got != nil || err != nil || resp.StatusCode != 404 {
		t.Errorf("after delete: %v, %v, %d", got, err, resp.StatusCode)
	}
	if n := len(s.PrimaryIPs()); n != 0 {
		t.Errorf("%d primary IPs left", n)
	}
	f, _, _ := c.Firewall.GetByID(t.Context(), fw.Firewall.ID)
	if len(f.AppliedTo) != 0 {
		t.Errorf("firewall still applied to %+v", f.AppliedTo)
	}
	if _, err := c.Firewall.Delete(t.Context(), f); err != nil {
		t.Errorf("deleting the freed firewall: %v", err)
	}
}

// TestHoldStarting: a held server's actions succeed but it stays "starting" until
// released; it can be deleted meanwhile.
func TestHoldStarting(t *testing.T) {
	s, c := fake(t)
	s.HoldStarting("stuck")
	sv := mustCreate(t, c, "stuck", nil)
	for range 5 {
		if got, _, _ := c.Server.GetByID(t.Context(), sv.ID); got.Status != hcloud.ServerStatusStarting || got.Locked {
			t.Fatalf("held server: %s, locked %v", got.Status, got.Locked)
		}
	}
	s.ReleaseStarting("stuck")
	if got, _, _ := c.Server.GetByID(t.Context(), sv.ID); got.Status != hcloud.ServerStatusRunning {
		t.Errorf("released: %s", got.Status)
	}
	s.HoldStarting("stuck2")
	sv2 := mustCreate(t, c, "stuck2", nil)
	res, _, err := c.Server.DeleteWithResult(t.Context(), sv2)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Action.WaitFor(t.Context(), res.Action); err != nil {
		t.Fatal(err)
	}
}

// TestActionPollsZero: with SetActionPolls(0) a create answers finished actions and a
// running server.
func TestActionPollsZero(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	res, err := create(t, c, "quick", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Action.Status != hcloud.ActionStatusSuccess || res.NextActions[0].Status != hcloud.ActionStatusSuccess || res.Server.Status != hcloud.ServerStatusRunning {
		t.Errorf("create: %s/%s, server %s", res.Action.Status, res.NextActions[0].Status, res.Server.Status)
	}
}

// TestUpdateServer: PUT renames and relabels, refusing a taken name and bad labels.
func TestUpdateServer(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	a := mustCreate(t, c, "a", nil)
	mustCreate(t, c, "b", nil)
	got, _, err := c.Server.Update(t.Context(), a, hcloud.ServerUpdateOpts{Name: "a2", Labels: map[string]string{"k": "v"}})
	if err != nil || got.Name != "a2" || got.Labels["k"] != "v" {
		t.Fatalf("update: %+v, %v", got, err)
	}
	if _, _, err := c.Server.Update(t.Context(), a, hcloud.ServerUpdateOpts{Name: "b"}); !hcloud.IsError(err, hcloud.ErrorCodeUniquenessError) {
		t.Errorf("rename to a taken name: %v", err)
	}
	if _, _, err := c.Server.Update(t.Context(), a, hcloud.ServerUpdateOpts{Labels: map[string]string{"-bad": "v"}}); !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
		t.Errorf("bad label: %v", err)
	}
}

// TestConcurrentCreates: parallel creates and waits over one fake, under -race, each
// server with its own addresses.
func TestConcurrentCreates(t *testing.T) {
	s, c := fake(t)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{Name: "p" + string(rune('a'+i)),
				ServerType: &hcloud.ServerType{Name: "cx23"}, Image: &hcloud.Image{Name: "debian-13"}})
			if err == nil {
				err = c.Action.WaitFor(t.Context(), append([]*hcloud.Action{res.Action}, res.NextActions...)...)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	seen := map[string]bool{}
	for _, sv := range s.Servers() {
		if seen[sv.PublicNet.IPv4.IP] || sv.Location.Name != "fsn1" {
			t.Errorf("server %s: ipv4 %s in %s", sv.Name, sv.PublicNet.IPv4.IP, sv.Location.Name)
		}
		seen[sv.PublicNet.IPv4.IP] = true
	}
	if len(seen) != 8 {
		t.Errorf("%d servers", len(seen))
	}
}
