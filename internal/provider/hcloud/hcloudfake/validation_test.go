package hcloudfake

import (
	"strings"
	"testing"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// fieldsOf is the invalid_input details the client parsed: field name to messages.
func fieldsOf(t *testing.T, err error) map[string][]string {
	t.Helper()
	d, ok := apiErr(t, err).Details.(hcloud.ErrorDetailsInvalidInput)
	if !ok {
		t.Fatalf("no invalid_input details in %v", err)
	}
	out := map[string][]string{}
	for _, f := range d.Fields {
		out[f.Name] = f.Messages
	}
	return out
}

// TestCreateRefusesWhatTheAPIRefuses: each bad create is refused with the code and the
// field the real API names, and creates nothing.
func TestCreateRefusesWhatTheAPIRefuses(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name  string
		opts  func(*hcloud.ServerCreateOpts)
		code  hcloud.ErrorCode
		field string
	}{
		{"name with underscore", func(o *hcloud.ServerCreateOpts) { o.Name = "bad_name" }, hcloud.ErrorCodeInvalidInput, "name"},
		{"name label of 64", func(o *hcloud.ServerCreateOpts) { o.Name = long }, hcloud.ErrorCodeInvalidInput, "name"},
		{"name ending in a hyphen", func(o *hcloud.ServerCreateOpts) { o.Name = "proxy-" }, hcloud.ErrorCodeInvalidInput, "name"},
		{"user_data over 32 KiB", func(o *hcloud.ServerCreateOpts) { o.UserData = strings.Repeat("x", MaxUserData+1) }, hcloud.ErrorCodeInvalidInput, "user_data"},
		{"label key with a space", func(o *hcloud.ServerCreateOpts) { o.Labels = map[string]string{"a b": "v"} }, hcloud.ErrorCodeInvalidInput, "labels"},
		{"label value of 64", func(o *hcloud.ServerCreateOpts) { o.Labels = map[string]string{"k": long} }, hcloud.ErrorCodeInvalidInput, "labels"},
		{"label value ending in a dot", func(o *hcloud.ServerCreateOpts) { o.Labels = map[string]string{"k": "v."} }, hcloud.ErrorCodeInvalidInput, "labels"},
		{"unknown server type", func(o *hcloud.ServerCreateOpts) { o.ServerType = &hcloud.ServerType{Name: "cx99"} }, hcloud.ErrorCodeInvalidInput, "server_type"},
		{"unknown image", func(o *hcloud.ServerCreateOpts) { o.Image = &hcloud.Image{Name: "windows-95"} }, hcloud.ErrorCodeInvalidInput, "image"},
		{"arm image on x86", func(o *hcloud.ServerCreateOpts) { o.Image = &hcloud.Image{ID: 100002} }, hcloud.ErrorCodeInvalidInput, "image"},
		{"unknown location", func(o *hcloud.ServerCreateOpts) { o.Location = &hcloud.Location{Name: "mars1"} }, hcloud.ErrorCodeInvalidInput, "location"},
		{"no public net and no network", func(o *hcloud.ServerCreateOpts) { o.PublicNet = &hcloud.ServerCreatePublicNet{} }, hcloud.ErrorCodeInvalidInput, "public_net"},
		{"unknown firewall", func(o *hcloud.ServerCreateOpts) {
			o.Firewalls = []*hcloud.ServerCreateFirewall{{Firewall: hcloud.Firewall{ID: 42}}}
		}, hcloud.ErrorCodeInvalidInput, "firewalls"},
		{"type not in the location", func(o *hcloud.ServerCreateOpts) { o.Location = &hcloud.Location{Name: "ash"} }, hcloud.ErrorCodeResourceUnavailable, ""},
		{"deprecated type past unavailable_after", func(o *hcloud.ServerCreateOpts) { o.ServerType = &hcloud.ServerType{Name: "cx22"} }, hcloud.ErrorCodeResourceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := fake(t)
			opts := hcloud.ServerCreateOpts{Name: "proxy-1", ServerType: &hcloud.ServerType{Name: "cx23"},
				Image: &hcloud.Image{Name: "debian-13"}, Location: &hcloud.Location{Name: "fsn1"}}
			tc.opts(&opts)
			_, resp, err := c.Server.Create(t.Context(), opts)
			if !hcloud.IsError(err, tc.code) {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if resp.StatusCode != StatusOf(string(tc.code)) {
				t.Errorf("status %d, want %d", resp.StatusCode, StatusOf(string(tc.code)))
			}
			if tc.field != "" {
				if f := fieldsOf(t, err); len(f[tc.field]) == 0 {
					t.Errorf("details %v name no %s", f, tc.field)
				}
			}
			if n := len(s.Servers()); n != 0 {
				t.Errorf("%d servers made", n)
			}
		})
	}
}

// TestCreateAcceptsTheLimits: 32 KiB of user_data exactly, a 63-character name label,
// an empty label value and a prefixed key pass; an arm type gets the arm image by name.
func TestCreateAcceptsTheLimits(t *testing.T) {
	s, c := fake(t)
	res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{Name: strings.Repeat("a", 63) + ".example.com",
		ServerType: &hcloud.ServerType{Name: "cax11"}, Image: &hcloud.Image{Name: "debian-13"},
		UserData: strings.Repeat("x", MaxUserData), Labels: map[string]string{"egress.example.com/uid": "", "k": "v_1.2-3"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Server.Image.Architecture != hcloud.ArchitectureARM || len(s.UserData(res.Server.ID)) != MaxUserData {
		t.Errorf("image %+v, user data %d bytes", res.Server.Image, len(s.UserData(res.Server.ID)))
	}
}

// TestNamesAreUniquePerProject: a second server of a name is uniqueness_error (409).
func TestNamesAreUniquePerProject(t *testing.T) {
	_, c := fake(t)
	mustCreate(t, c, "twin", nil)
	_, err := create(t, c, "twin", nil)
	if !hcloud.IsError(err, hcloud.ErrorCodeUniquenessError) || apiErr(t, err).Response().StatusCode != 409 {
		t.Fatalf("second twin: %v", err)
	}
}

// TestQuotas: the server, primary IP and firewall limits refuse with
// resource_limit_exceeded; an IPv6-only server needs one primary IP.
func TestQuotas(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	s.SetQuota(Quota{Servers: 2, PrimaryIPs: 3, Firewalls: 1})
	mustCreate(t, c, "one", nil)
	_, err := create(t, c, "two", nil)
	if !hcloud.IsError(err, hcloud.ErrorCodeResourceLimitExceeded) || !strings.Contains(err.Error(), "primary IP") {
		t.Fatalf("third and fourth primary IP: %v", err)
	}
	res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{Name: "v6only", ServerType: &hcloud.ServerType{Name: "cx23"},
		Image: &hcloud.Image{Name: "debian-13"}, PublicNet: &hcloud.ServerCreatePublicNet{EnableIPv6: true}})
	if err != nil {
		t.Fatalf("IPv6-only server within the primary IP limit: %v", err)
	}
	if res.Server.PublicNet.IPv4.IP != nil || res.Server.PublicNet.IPv6.Network == nil {
		t.Errorf("IPv6-only server's public net %+v", res.Server.PublicNet)
	}
	_, err = create(t, c, "three", nil)
	if !hcloud.IsError(err, hcloud.ErrorCodeResourceLimitExceeded) || !strings.Contains(err.Error(), "server limit") {
		t.Fatalf("third server: %v", err)
	}
	if _, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "f1"}); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "f2"})
	if !hcloud.IsError(err, hcloud.ErrorCodeResourceLimitExceeded) {
		t.Fatalf("second firewall: %v", err)
	}
	ips, err := c.PrimaryIP.All(t.Context())
	if err != nil || len(ips) != 3 {
		t.Errorf("primary IPs listed: %d, %v", len(ips), err)
	}
}

// TestSoldOutLocation: SetAvailable(false) makes creates there resource_unavailable and
// shows in the server type's locations.
func TestSoldOutLocation(t *testing.T) {
	s, c := fake(t)
	if err := s.SetAvailable("cx23", "fsn1", false); err != nil {
		t.Fatal(err)
	}
	_, err := create(t, c, "p", nil)
	if !hcloud.IsError(err, hcloud.ErrorCodeResourceUnavailable) || apiErr(t, err).Response().StatusCode != 412 ||
		!strings.HasPrefix(err.Error(), "error during placement (resource_unavailable, ") {
		t.Fatalf("create in a sold-out location: %v", err)
	}
	st, _, err := c.ServerType.GetByName(t.Context(), "cx23")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range st.Locations {
		if l.Location.Name == "fsn1" && l.Available || l.Location.Name == "nbg1" && !l.Available {
			t.Errorf("location %s available %v", l.Location.Name, l.Available)
		}
	}
}
