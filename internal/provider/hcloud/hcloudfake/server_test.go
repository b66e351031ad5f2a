package hcloudfake

import (
	"context"
	"errors"
	"net/http"
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

var _ = context.Background
var _ = http.StatusOK
