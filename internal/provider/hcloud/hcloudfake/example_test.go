package hcloudfake_test

import (
	"context"
	"fmt"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
)

// The official client pointed at the fake: a server is created, its actions are waited
// for, and a sold-out location answers as the real API does.
func Example() {
	fake := hcloudfake.New()
	defer fake.Close()
	c := hcloud.NewClient(hcloud.WithEndpoint(fake.URL), hcloud.WithToken(hcloudfake.Token),
		hcloud.WithPollOpts(hcloud.PollOpts{BackoffFunc: hcloud.ConstantBackoff(time.Millisecond)}))
	ctx := context.Background()

	res, _, err := c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "proxy-1",
		ServerType: &hcloud.ServerType{Name: "cx23"}, Image: &hcloud.Image{Name: "debian-13"},
		Location: &hcloud.Location{Name: "nbg1"}, Labels: map[string]string{"install": "demo"}})
	if err != nil {
		panic(err)
	}
	if err := c.Action.WaitFor(ctx, append([]*hcloud.Action{res.Action}, res.NextActions...)...); err != nil {
		panic(err)
	}
	sv, _, _ := c.Server.GetByID(ctx, res.Server.ID)
	fmt.Println(sv.Status, sv.PublicNet.IPv4.IP, sv.PublicNet.IPv6.Network)

	_ = fake.SetAvailable("cx23", "hel1", false)
	_, _, err = c.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "proxy-2",
		ServerType: &hcloud.ServerType{Name: "cx23"}, Image: &hcloud.Image{Name: "debian-13"},
		Location: &hcloud.Location{Name: "hel1"}})
	fmt.Println(hcloud.IsError(err, hcloud.ErrorCodeResourceUnavailable))
	// Output:
	// running 203.0.113.1 2001:db8:1::/64
	// true
}
