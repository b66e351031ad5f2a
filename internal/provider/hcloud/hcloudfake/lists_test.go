package hcloudfake

import (
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// TestPagination: lists answer per_page items (25 by default, 50 at most) with
// meta.pagination; the client's All follows next_page to the end.
func TestPagination(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	s.SetQuota(Quota{Servers: 60, PrimaryIPs: 120, Firewalls: 1})
	for i := range 57 {
		mustCreate(t, c, fmt.Sprintf("s%02d", i), nil)
	}
	all, err := c.Server.All(t.Context())
	if err != nil || len(all) != 57 || all[0].Name != "s00" || all[56].Name != "s56" {
		t.Fatalf("All: %d, %v", len(all), err)
	}
	if n := s.CallCount(ServersList); n != 2 {
		t.Errorf("All took %d pages at per_page 50", n)
	}
	page, resp, err := c.Server.List(t.Context(), hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{Page: 3, PerPage: 10}})
	p := resp.Meta.Pagination
	if err != nil || len(page) != 10 || page[0].Name != "s20" || p.Page != 3 || p.PerPage != 10 || p.PreviousPage != 2 || p.NextPage != 4 || p.LastPage != 6 || p.TotalEntries != 57 {
		t.Errorf("page 3 of 10: %d items, %+v, %v", len(page), p, err)
	}
	page, resp, _ = c.Server.List(t.Context(), hcloud.ServerListOpts{})
	if len(page) != DefaultPerPage || resp.Meta.Pagination.PerPage != DefaultPerPage {
		t.Errorf("default page: %d, %+v", len(page), resp.Meta.Pagination)
	}
	page, resp, _ = c.Server.List(t.Context(), hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{PerPage: 500, Page: 2}})
	if len(page) != 7 || resp.Meta.Pagination.NextPage != 0 || resp.Meta.Pagination.PerPage != MaxPerPage {
		t.Errorf("last page at per_page 500: %d, %+v", len(page), resp.Meta.Pagination)
	}
	page, _, _ = c.Server.List(t.Context(), hcloud.ServerListOpts{Sort: []string{"name:desc"}, ListOpts: hcloud.ListOpts{PerPage: 2}})
	if len(page) != 2 || page[0].Name != "s56" {
		t.Errorf("sorted by name:desc: %v", page)
	}
	if _, _, err := c.Server.List(t.Context(), hcloud.ServerListOpts{Sort: []string{"colour"}}); !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
		t.Errorf("unknown sort: %v", err)
	}
}

// TestLabelSelectors: the selector grammar over servers' labels, and refusal of what
// does not parse.
func TestLabelSelectors(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	for name, l := range map[string]map[string]string{
		"a": {"install": "one", "role": "proxy"},
		"b": {"install": "two", "role": "proxy"},
		"c": {"install": "one"},
		"d": {},
	} {
		mustCreate(t, c, name, l)
	}
	for sel, want := range map[string]string{
		"":                           "a,b,c,d",
		"install=one":                "a,c",
		"install==one":               "a,c",
		"install!=one":               "b,d",
		"role":                       "a,b",
		"!role":                      "c,d",
		"install=one,role":           "a",
		"install in (one,two)":       "a,b,c",
		"install notin (two)":        "a,c,d",
		"install in (two), role":     "b",
		"install notin (one,two),!k": "d",
		"role=proxy,install!=two":    "a",
	} {
		list, err := c.Server.AllWithOpts(t.Context(), hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: sel}})
		if err != nil {
			t.Errorf("%q: %v", sel, err)
			continue
		}
		var names []string
		for _, sv := range list {
			names = append(names, sv.Name)
		}
		slices.Sort(names)
		if got := strings.Join(names, ","); got != want {
			t.Errorf("%q selected %s, want %s", sel, got, want)
		}
	}
	for _, bad := range []string{"install in (one", "=one", "install=one,", "a b=c", "k=v v"} {
		_, _, err := c.Server.List(t.Context(), hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: bad}})
		if !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
			t.Errorf("%q: %v", bad, err)
		} else if f := fieldsOf(t, err); len(f["label_selector"]) == 0 {
			t.Errorf("%q: fields %v", bad, f)
		}
	}
	list, _, err := c.Server.List(t.Context(), hcloud.ServerListOpts{Name: "c"})
	if err != nil || len(list) != 1 || list[0].Name != "c" {
		t.Errorf("by name: %v, %v", list, err)
	}
	list, _, _ = c.Server.List(t.Context(), hcloud.ServerListOpts{Status: []hcloud.ServerStatus{hcloud.ServerStatusOff}})
	if len(list) != 0 {
		t.Errorf("%d off servers", len(list))
	}
}

// TestCatalogue: locations, server types with per-location prices, availability and
// deprecation, images by name and architecture, primary IPs and the price list, all read
// through the client.
func TestCatalogue(t *testing.T) {
	s, c := fake(t)
	locs, err := c.Location.All(t.Context())
	if err != nil || len(locs) != 6 || locs[0].Name != "fsn1" || locs[3].NetworkZone != "us-east" {
		t.Fatalf("locations: %v, %v", locs, err)
	}
	if l, _, err := c.Location.GetByName(t.Context(), "hel1"); err != nil || l.Country != "FI" {
		t.Errorf("hel1: %+v, %v", l, err)
	}
	st, _, err := c.ServerType.GetByName(t.Context(), "cpx22")
	if err != nil || st.Architecture != hcloud.ArchitectureX86 || len(st.Locations) != 6 || len(st.Pricings) != 6 ||
		st.Pricings[0].Monthly.Net != "5.9900" || st.Pricings[0].IncludedTraffic == 0 {
		t.Fatalf("cpx22: %+v, %v", st, err)
	}
	old, _, _ := c.ServerType.GetByName(t.Context(), "cx22")
	if !old.IsDeprecated() || !old.UnavailableAfter().Before(s.now()) || !old.Locations[0].IsDeprecated() {
		t.Errorf("cx22 deprecation: %+v", old.DeprecatableResource)
	}
	img, _, err := c.Image.GetForArchitecture(t.Context(), "debian-13", hcloud.ArchitectureARM)
	if err != nil || img == nil || img.Architecture != hcloud.ArchitectureARM || img.Name != "debian-13" {
		t.Fatalf("debian-13 arm: %+v, %v", img, err)
	}
	if byID, _, err := c.Image.GetForArchitecture(t.Context(), fmt.Sprint(img.ID), hcloud.ArchitectureX86); err != nil || byID.ID != img.ID {
		t.Errorf("image by ID: %+v, %v", byID, err)
	}
	if none, _, err := c.Image.GetForArchitecture(t.Context(), "debian-99", hcloud.ArchitectureX86); none != nil || err != nil {
		t.Errorf("unknown image: %+v, %v", none, err)
	}
	s.SetActionPolls(0)
	sv := mustCreate(t, c, "priced", nil)
	ips, err := c.PrimaryIP.All(t.Context())
	if err != nil || len(ips) != 2 || ips[0].Type != hcloud.PrimaryIPTypeIPv4 || ips[0].AssigneeID != sv.ID || !ips[0].AutoDelete ||
		ips[1].Type != hcloud.PrimaryIPTypeIPv6 || ips[1].IP.String() != "2001:db8:1::" {
		t.Errorf("primary IPs: %+v, %v", ips, err)
	}
	pr, _, err := c.Pricing.Get(t.Context())
	if err != nil || pr.Currency != "EUR" || len(pr.ServerTypes) != 4 || len(pr.PrimaryIPs) != 2 {
		t.Fatalf("pricing: %+v, %v", pr, err)
	}
	if v4 := pr.PrimaryIPs[0]; v4.Type != "ipv4" || v4.Pricings[0].Location != "fsn1" || v4.Pricings[0].Monthly.Net != "0.5000" {
		t.Errorf("ipv4 price: %+v", v4)
	}
}

// TestGetByIDAndNotFound: each catalogue resource by ID, and not_found (which the
// client turns into nil, nil) for an ID that is not there.
func TestGetByIDAndNotFound(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	sv := mustCreate(t, c, "x", nil)
	if l, _, err := c.Location.GetByID(t.Context(), 4); err != nil || l.Name != "ash" {
		t.Errorf("location 4: %+v, %v", l, err)
	}
	if st, _, err := c.ServerType.GetByID(t.Context(), 45); err != nil || st.Name != "cax11" || st.Architecture != hcloud.ArchitectureARM {
		t.Errorf("server type 45: %+v, %v", st, err)
	}
	if ip, _, err := c.PrimaryIP.GetByID(t.Context(), sv.PublicNet.IPv4.ID); err != nil || !ip.IP.Equal(sv.PublicNet.IPv4.IP) {
		t.Errorf("primary IP %d: %+v, %v", sv.PublicNet.IPv4.ID, ip, err)
	}
	for name, get := range map[string]func() (any, error){
		"location":    func() (any, error) { v, _, err := c.Location.GetByID(t.Context(), 99); return v, err },
		"server type": func() (any, error) { v, _, err := c.ServerType.GetByID(t.Context(), 99); return v, err },
		"image":       func() (any, error) { v, _, err := c.Image.GetByID(t.Context(), 99); return v, err },
		"primary IP":  func() (any, error) { v, _, err := c.PrimaryIP.GetByID(t.Context(), 99); return v, err },
		"server":      func() (any, error) { v, _, err := c.Server.GetByID(t.Context(), 99); return v, err },
		"firewall":    func() (any, error) { v, _, err := c.Firewall.GetByID(t.Context(), 99); return v, err },
	} {
		v, err := get()
		if err != nil || !reflectNil(v) {
			t.Errorf("%s 99: %v, %v", name, v, err)
		}
	}
}

func reflectNil(v any) bool {
	return v == nil || reflect.ValueOf(v).Kind() == reflect.Pointer && reflect.ValueOf(v).IsNil()
}

// TestSeedingAndChangesBehindTheBack: the state seeders show through the client.
func TestSeedingAndChangesBehindTheBack(t *testing.T) {
	s, c := fake(t)
	id, err := s.SeedServer("old", "cpx22", "debian-12", "hil", map[string]string{"install": "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SeedServer("old", "cpx22", "debian-12", "hil", nil); err == nil {
		t.Error("a second seeded server of a name")
	}
	list, err := c.Server.AllWithOpts(t.Context(), hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: "install=a"}})
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].Status != hcloud.ServerStatusRunning || list[0].Location.Name != "hil" {
		t.Fatalf("seeded: %+v, %v", list, err)
	}
	s.SetServerStatus(id, "off")
	if sv, _, _ := c.Server.GetByID(t.Context(), id); sv.Status != hcloud.ServerStatusOff {
		t.Errorf("after SetServerStatus: %s", sv.Status)
	}
	s.RemoveServer(id)
	if sv, _, _ := c.Server.GetByID(t.Context(), id); sv != nil || len(s.PrimaryIPs()) != 0 {
		t.Errorf("after RemoveServer: %v, %d primary IPs", sv, len(s.PrimaryIPs()))
	}
	st := s.ServerTypes()[0]
	st.Name, st.ID = "cx99", 999
	s.SetServerType(st)
	s.SetLocation(schema.Location{ID: 7, Name: "fsn2", NetworkZone: "eu-central"})
	name := "debian-14"
	s.SetImage(schema.Image{ID: 7, Name: &name, Type: "system", Status: "available", Architecture: "x86"})
	s.SetPrimaryIPPrices([]schema.PricingPrimaryIP{{Type: "ipv4", Prices: []schema.PricingPrimaryIPTypePrice{
		{Location: "fsn1", PriceMonthly: schema.Price{Net: "0.6000", Gross: "0.7140"}}}}})
	s.SetQuota(Quota{Servers: 1, Firewalls: 1, PrimaryIPs: 2})
	if q := s.Quota(); q.Servers != 1 {
		t.Errorf("quota %+v", q)
	}
	if st, _, _ := c.ServerType.GetByName(t.Context(), "cx99"); st == nil {
		t.Error("set server type not listed")
	}
	if l, _, _ := c.Location.GetByName(t.Context(), "fsn2"); l == nil {
		t.Error("set location not listed")
	}
	if img, _, _ := c.Image.GetForArchitecture(t.Context(), "debian-14", hcloud.ArchitectureX86); img == nil || img.ID != 7 {
		t.Errorf("set image: %+v", img)
	}
	pr, _, err := c.Pricing.Get(t.Context())
	if err != nil || len(pr.PrimaryIPs) != 1 || pr.PrimaryIPs[0].Pricings[0].Monthly.Net != "0.6000" {
		t.Errorf("set prices: %+v, %v", pr.PrimaryIPs, err)
	}
	fw, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "f", Rules: []hcloud.FirewallRule{{
		Direction: hcloud.FirewallRuleDirectionIn, Protocol: hcloud.FirewallRuleProtocolICMP, SourceIPs: []net.IPNet{cidr(t, "::/0")}}}})
	if err != nil {
		t.Fatal(err)
	}
	s.RemoveFirewall(fw.Firewall.ID)
	if f, _, _ := c.Firewall.GetByID(t.Context(), fw.Firewall.ID); f != nil {
		t.Error("firewall after RemoveFirewall")
	}
	if a, ok := s.Action(fw.Actions[0].ID); !ok || a.Command != "set_firewall_rules" {
		t.Errorf("Action(%d): %+v, %v", fw.Actions[0].ID, a, ok)
	}
}
