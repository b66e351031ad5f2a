package hcloudfake

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

func ptr[T any](v T) *T { return &v }

func price(net string) schema.Price {
	// Gross at the German VAT rate of 19 %, as the API reports for a German customer.
	var n float64
	_, _ = fmt.Sscanf(net, "%g", &n)
	return schema.Price{Net: net, Gross: strconv.FormatFloat(n*1.19, 'f', 4, 64)}
}

func typePrices(hourly, monthly string, traffic uint64, locs ...string) []schema.PricingServerTypePrice {
	var out []schema.PricingServerTypePrice
	for _, l := range locs {
		out = append(out, schema.PricingServerTypePrice{Location: l, PriceHourly: price(hourly), PriceMonthly: price(monthly),
			IncludedTraffic: traffic, PricePerTBTraffic: price("1.0000")})
	}
	return out
}

// seed fills the default catalogue. The locations are Hetzner's; the server types,
// images and prices are illustrative (of the shapes the API sends), not a price list.
func seed(s *Server) {
	s.locations = []schema.Location{
		{ID: 1, Name: "fsn1", Description: "Falkenstein DC Park 1", Country: "DE", City: "Falkenstein", Latitude: 50.47612, Longitude: 12.370071, NetworkZone: "eu-central"},
		{ID: 2, Name: "nbg1", Description: "Nuremberg DC Park 1", Country: "DE", City: "Nuremberg", Latitude: 49.452102, Longitude: 11.076665, NetworkZone: "eu-central"},
		{ID: 3, Name: "hel1", Description: "Helsinki DC Park 1", Country: "FI", City: "Helsinki", Latitude: 60.169855, Longitude: 24.938379, NetworkZone: "eu-central"},
		{ID: 4, Name: "ash", Description: "Ashburn, VA", Country: "US", City: "Ashburn, VA", Latitude: 39.045821, Longitude: -77.487073, NetworkZone: "us-east"},
		{ID: 5, Name: "hil", Description: "Hillsboro, OR", Country: "US", City: "Hillsboro, OR", Latitude: 45.54222, Longitude: -122.95125, NetworkZone: "us-west"},
		{ID: 6, Name: "sin", Description: "Singapore", Country: "SG", City: "Singapore", Latitude: 1.283333, Longitude: 103.833333, NetworkZone: "ap-southeast"},
	}
	eu := []string{"fsn1", "nbg1", "hel1"}
	all := []string{"fsn1", "nbg1", "hel1", "ash", "hil", "sin"}
	st := func(id int64, name, desc, cpu, arch string, cores int, mem float32, disk int, hourly, monthly string, locs []string) schema.ServerType {
		t := schema.ServerType{ID: id, Name: name, Description: desc, Category: "shared", Cores: cores, Memory: mem, Disk: disk,
			StorageType: "local", CPUType: cpu, Architecture: arch,
			Prices: typePrices(hourly, monthly, 20<<40, locs...)}
		for _, l := range locs {
			loc := s.location(l)
			t.Locations = append(t.Locations, schema.ServerTypeLocation{ID: loc.ID, Name: l, Available: true, Recommended: true})
		}
		return t
	}
	announced := time.Date(2025, 10, 16, 0, 0, 0, 0, time.UTC)
	gone := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cx22 := st(104, "cx22", "CX22", "shared", "x86", 2, 4, 40, "0.0060", "3.7900", eu)
	// The API moved deprecation to each location (the type-wide one is phased out);
	// cx22 carries both, as types deprecated during the change do.
	cx22.Deprecation = &schema.DeprecationInfo{Announced: announced, UnavailableAfter: gone}
	for i := range cx22.Locations {
		cx22.Locations[i].Deprecation = cx22.Deprecation
	}
	s.serverTypes = []schema.ServerType{
		st(114, "cx23", "CX23", "shared", "x86", 2, 4, 40, "0.0048", "2.9900", eu),
		st(115, "cpx22", "CPX22", "shared", "x86", 2, 4, 80, "0.0096", "5.9900", all),
		st(45, "cax11", "CAX11", "shared", "arm", 2, 4, 40, "0.0064", "3.7900", eu),
		cx22,
	}
	created := time.Date(2025, 8, 12, 0, 0, 0, 0, time.UTC)
	id := int64(100000)
	for _, os := range []struct{ name, flavor, version, desc string }{
		{"debian-12", "debian", "12", "Debian 12"}, {"debian-13", "debian", "13", "Debian 13"}, {"ubuntu-24.04", "ubuntu", "24.04", "Ubuntu 24.04"},
	} {
		for _, arch := range []string{"x86", "arm"} {
			id++
			s.images = append(s.images, schema.Image{ID: id, Status: "available", Type: "system", Name: ptr(os.name),
				Description: os.desc, DiskSize: 5, Created: ptr(created), OSFlavor: os.flavor, OSVersion: ptr(os.version),
				Architecture: arch, RapidDeploy: true, Labels: map[string]string{}})
		}
	}
	for _, typ := range []string{"ipv4", "ipv6"} {
		p := schema.PricingPrimaryIP{Type: typ}
		for _, l := range all {
			h, m := "0.0008", "0.5000"
			if typ == "ipv6" {
				h, m = "0.0000", "0.0000"
			}
			p.Prices = append(p.Prices, schema.PricingPrimaryIPTypePrice{Location: l, PriceHourly: price(h), PriceMonthly: price(m)})
		}
		s.ipPrices = append(s.ipPrices, p)
	}
}

// SetLocation adds a location or replaces the one of the same name.
func (s *Server) SetLocation(l schema.Location) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.IndexFunc(s.locations, func(x schema.Location) bool { return x.Name == l.Name }); i >= 0 {
		s.locations[i] = l
		return
	}
	s.locations = append(s.locations, l)
}

// SetServerType adds a server type or replaces the one of the same name (its Locations
// say where it can be ordered, its Prices what it costs there).
func (s *Server) SetServerType(st schema.ServerType) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.IndexFunc(s.serverTypes, func(x schema.ServerType) bool { return x.Name == st.Name }); i >= 0 {
		s.serverTypes[i] = st
		return
	}
	s.serverTypes = append(s.serverTypes, st)
}

// SetAvailable says whether a server type can be ordered in a location (a sold-out
// location: false, and creates there get resource_unavailable); it adds the location to
// the type's list when missing.
func (s *Server) SetAvailable(serverType, location string, available bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.serverType(schema.IDOrName{Name: serverType})
	loc := s.location(location)
	if st == nil || loc == nil {
		return fmt.Errorf("hcloudfake: no server type %q or location %q", serverType, location)
	}
	for i := range st.Locations {
		if st.Locations[i].Name == location {
			st.Locations[i].Available = available
			return nil
		}
	}
	st.Locations = append(st.Locations, schema.ServerTypeLocation{ID: loc.ID, Name: location, Available: available})
	return nil
}

// SetImage adds an image or replaces the one of the same ID.
func (s *Server) SetImage(img schema.Image) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.IndexFunc(s.images, func(x schema.Image) bool { return x.ID == img.ID }); i >= 0 {
		s.images[i] = img
		return
	}
	s.images = append(s.images, img)
}

// SetPrimaryIPPrices replaces the primary IPs' prices in GET /pricing.
func (s *Server) SetPrimaryIPPrices(p []schema.PricingPrimaryIP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ipPrices = p
}

// SetQuota sets the project's limits.
func (s *Server) SetQuota(q Quota) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.quota = q
}

// Quota returns the project's limits.
func (s *Server) Quota() Quota {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quota
}

// Locations returns the locations.
func (s *Server) Locations() []schema.Location {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.locations)
}

// ServerTypes returns the server types.
func (s *Server) ServerTypes() []schema.ServerType {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.serverTypes)
}

// Images returns the images.
func (s *Server) Images() []schema.Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.images)
}

// PrimaryIPs returns the primary IPs, by ID.
func (s *Server) PrimaryIPs() []schema.PrimaryIP {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schema.PrimaryIP
	for _, id := range sortedKeys(s.primaryIPs) {
		out = append(out, s.primaryIPs[id].PrimaryIP)
	}
	return out
}

// list answers a catalogue list: the items name filters (when set), sorted by sort
// (id, name), paginated, under key.
func list[T any](w http.ResponseWriter, r *http.Request, key string, items []T, idOf func(T) int64, nameOf func(T) string, keep func(T) bool) {
	q := r.URL.Query()
	var out []T
	for _, it := range items {
		if n := q.Get("name"); n != "" && nameOf(it) != n {
			continue
		}
		if keep == nil || keep(it) {
			out = append(out, it)
		}
	}
	respond(w, r, key, out, map[string]func(a, b T) int{
		"id":   func(a, b T) int { return cmpInt(idOf(a), idOf(b)) },
		"name": func(a, b T) int { return strings.Compare(nameOf(a), nameOf(b)) },
	})
}

func get[T any](w http.ResponseWriter, r *http.Request, kind, key string, items []T, idOf func(T) int64) {
	id, ok := pathID(w, r, kind)
	if !ok {
		return
	}
	for _, it := range items {
		if idOf(it) == id {
			writeJSON(w, http.StatusOK, map[string]any{key: it})
			return
		}
	}
	notFound(w, kind, id)
}

func locID(l schema.Location) int64     { return l.ID }
func locName(l schema.Location) string  { return l.Name }
func stID(t schema.ServerType) int64    { return t.ID }
func stName(t schema.ServerType) string { return t.Name }
func imgID(i schema.Image) int64        { return i.ID }
func imgName(i schema.Image) string {
	if i.Name == nil {
		return ""
	}
	return *i.Name
}
func pipID(p schema.PrimaryIP) int64    { return p.ID }
func pipName(p schema.PrimaryIP) string { return p.Name }

func (s *Server) listLocations(w http.ResponseWriter, r *http.Request) {
	list(w, r, "locations", s.locations, locID, locName, nil)
}

func (s *Server) getLocation(w http.ResponseWriter, r *http.Request) {
	get(w, r, "location", "location", s.locations, locID)
}

func (s *Server) listServerTypes(w http.ResponseWriter, r *http.Request) {
	list(w, r, "server_types", s.serverTypes, stID, stName, nil)
}

func (s *Server) getServerType(w http.ResponseWriter, r *http.Request) {
	get(w, r, "server_type", "server_type", s.serverTypes, stID)
}

// listImages takes name, architecture, type, status, include_deprecated and
// label_selector; deprecated images only with include_deprecated=true.
func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	sel, ok := selectorOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	list(w, r, "images", s.images, imgID, imgName, func(i schema.Image) bool {
		if a := q["architecture"]; len(a) > 0 && !slices.Contains(a, i.Architecture) {
			return false
		}
		if t := q["type"]; len(t) > 0 && !slices.Contains(t, i.Type) {
			return false
		}
		if st := q["status"]; len(st) > 0 && !slices.Contains(st, i.Status) {
			return false
		}
		if i.Deprecation != nil && q.Get("include_deprecated") != "true" {
			return false
		}
		return sel.matches(i.Labels)
	})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	get(w, r, "image", "image", s.images, imgID)
}

func (s *Server) primaryIPList() []schema.PrimaryIP {
	var out []schema.PrimaryIP
	for _, id := range sortedKeys(s.primaryIPs) {
		out = append(out, s.primaryIPs[id].PrimaryIP)
	}
	return out
}

// listPrimaryIPs takes name, ip and label_selector.
func (s *Server) listPrimaryIPs(w http.ResponseWriter, r *http.Request) {
	sel, ok := selectorOf(w, r)
	if !ok {
		return
	}
	ip := r.URL.Query().Get("ip")
	list(w, r, "primary_ips", s.primaryIPList(), pipID, pipName, func(p schema.PrimaryIP) bool {
		return (ip == "" || p.IP == ip) && sel.matches(p.Labels)
	})
}

func (s *Server) getPrimaryIP(w http.ResponseWriter, r *http.Request) {
	get(w, r, "primary_ip", "primary_ip", s.primaryIPList(), pipID)
}

// getPricing answers GET /pricing from the server types' prices and the primary IPs'.
func (s *Server) getPricing(w http.ResponseWriter, r *http.Request) {
	p := schema.Pricing{
		Currency: "EUR", VATRate: "19.00",
		Image:             schema.PricingImage{PricePerGBMonth: price("0.0110")},
		ServerBackup:      schema.PricingServerBackup{Percentage: "20.00"},
		Volume:            schema.PricingVolume{PricePerGBPerMonth: price("0.0440")},
		LoadBalancerTypes: []schema.PricingLoadBalancerType{},
		PrimaryIPs:        slices.Clone(s.ipPrices),
	}
	// floating_ips lists the same types as primary_ips, as the real answer does:
	// hcloud-go v2.52.0 sizes its primary IP prices by len(floating_ips) and panics on
	// an answer with fewer floating IP types than primary IP types.
	for _, ip := range s.ipPrices {
		ft := schema.PricingFloatingIPType{Type: ip.Type}
		for _, pr := range ip.Prices {
			ft.Prices = append(ft.Prices, schema.PricingFloatingIPTypePrice{Location: pr.Location, PriceMonthly: price("3.0000")})
		}
		p.FloatingIPs = append(p.FloatingIPs, ft)
	}
	for _, st := range s.serverTypes {
		p.ServerTypes = append(p.ServerTypes, schema.PricingServerType{ID: st.ID, Name: st.Name, Prices: st.Prices})
	}
	writeJSON(w, http.StatusOK, schema.PricingGetResponse{Pricing: p})
}
