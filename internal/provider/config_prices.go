package provider

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Prices is the prices block of a provider entry: what its instances cost per hour, by
// list price. A Proxy's status.cost is the price of its machine type plus, when it has an
// external IPv4 address, the address's (docs/pools.md, "Cost"). gce and hcloud ship a
// default table (DefaultPrices); a user's block overrides it key by key.
type Prices struct {
	// Currency is the ISO 4217 code every price of the block is in (USD, EUR...);
	// required when the block is given.
	Currency string `json:"currency,omitempty"`
	// MachineTypes maps the provider's own machine type names to their price per hour:
	// gce's machine types (e2-small, the values of gce.machineTypes, not the names
	// placement.machineType uses), hcloud's server types (cx22), kvm2's machineTypes keys.
	MachineTypes map[string]Price `json:"machineTypes,omitempty"`
	// IPv4Address is the price per hour of one external IPv4 address (gce's external
	// IP, hcloud's primary IPv4). Left out (with no default), addresses count as free.
	IPv4Address Price `json:"ipv4Address,omitempty"`
}

// Price is a price per hour, a decimal such as "0.0168". The config may give it as a
// YAML string or number.
type Price string

// UnmarshalJSON takes a JSON string or number by its text, a number with an exponent
// (how a small YAML float such as 0.0000001 arrives: 1e-07) written out as a plain
// decimal; anything else is kept as its text for Validate to refuse by name.
func (p *Price) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	switch {
	case s == "null":
		return nil
	case strings.HasPrefix(s, `"`):
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	if exponentRE.MatchString(s) {
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			s = strconv.FormatFloat(f, 'f', -1, 64)
		}
	}
	*p = Price(s)
	return nil
}

// exponentRE: a decimal with an exponent, such as 1e-07.
var exponentRE = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?[eE][-+]?[0-9]+$`)

// priceRE: a plain decimal, at most nine digits after the point (what a Quantity holds
// exactly).
var priceRE = regexp.MustCompile(`^[0-9]+(\.[0-9]{1,9})?$`)

// currencyRE: an ISO 4217 alphabetic code.
var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// problem says what is wrong with p, "" when it is a price per hour.
func (p Price) problem() string {
	s := string(p)
	switch {
	case strings.HasPrefix(s, "-") && priceRE.MatchString(s[1:]):
		return fmt.Sprintf("%q is negative: a price per hour is 0 or more", s)
	case !priceRE.MatchString(s):
		return fmt.Sprintf("%q is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)", s)
	}
	return ""
}

// quantity is p as a Quantity; p is valid.
func (p Price) quantity() resource.Quantity {
	q, err := resource.ParseQuantity(string(p))
	if err != nil { // Validate refused such a price
		return resource.Quantity{}
	}
	return q
}

// Validate checks the block and returns every problem, prefixed with "prices" and the
// path inside it, for example `prices.machineTypes.e2-small: "abc" is not a price per
// hour (a decimal such as 0.0168, ...)`.
func (p Prices) Validate() []error {
	var problems []error
	add := func(path, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	switch {
	case p.Currency == "":
		add("prices", "currency is required when prices are given (an ISO 4217 code such as USD or EUR)")
	case !currencyRE.MatchString(p.Currency):
		add("prices.currency", "%q is not a currency code (three upper-case letters of ISO 4217, such as USD or EUR)", p.Currency)
	}
	for _, k := range sortedKeys(p.MachineTypes) {
		if !validName(k) {
			add("prices.machineTypes", "key %q: %s", k, nameChars)
		} else if msg := p.MachineTypes[k].problem(); msg != "" {
			add("prices.machineTypes."+k, "%s", msg)
		}
	}
	if p.IPv4Address != "" {
		if msg := p.IPv4Address.problem(); msg != "" {
			add("prices.ipv4Address", "%s", msg)
		}
	}
	return problems
}

// Hourly is what an instance of machineType costs per hour, with one external IPv4
// address when ipv4 is set; false when the table has no price for machineType.
func (p Prices) Hourly(machineType string, ipv4 bool) (v1alpha1.Cost, bool) {
	price, ok := p.MachineTypes[machineType]
	if !ok || p.Currency == "" {
		return v1alpha1.Cost{}, false
	}
	q := price.quantity()
	if ipv4 && p.IPv4Address != "" {
		q.Add(p.IPv4Address.quantity())
	}
	return v1alpha1.Cost{Hourly: v1alpha1.AmountOf(q), Currency: p.Currency}, true
}

// validatePrices checks an entry's prices block, and that a gce entry prices its
// machine types rather than the names placement.machineType uses for them.
func (pc ProviderConfig) validatePrices() []error {
	if pc.Prices == nil {
		return nil
	}
	problems := pc.Prices.Validate()
	if pc.Type == TypeGCE && pc.GCE != nil {
		actual := map[string]bool{}
		for _, mt := range pc.GCE.MachineTypes {
			actual[mt] = true
		}
		for _, k := range sortedKeys(pc.Prices.MachineTypes) {
			if mt, alias := pc.GCE.MachineTypes[k]; alias && !actual[k] {
				problems = append(problems, fmt.Errorf("prices.machineTypes.%s: %q is a name of gce.machineTypes; price the GCE machine type it stands for (%s)", k, k, mt))
			}
		}
	}
	return problems
}

// PriceTable is the entry's prices: its type's default table (DefaultPrices) with the
// entry's own prices laid over it key by key. An entry whose currency differs from the
// default table's replaces the table whole. False when there are none (a kvm2 entry
// without prices).
func (pc ProviderConfig) PriceTable() (Prices, bool) {
	def, hasDefault := DefaultPrices(pc.Type)
	switch {
	case pc.Prices == nil && !hasDefault:
		return Prices{}, false
	case pc.Prices == nil:
		return def, true
	case !hasDefault || pc.Prices.Currency != def.Currency:
		own := *pc.Prices
		own.MachineTypes = maps.Clone(pc.Prices.MachineTypes)
		return own, true
	}
	maps.Copy(def.MachineTypes, pc.Prices.MachineTypes)
	if pc.Prices.IPv4Address != "" {
		def.IPv4Address = pc.Prices.IPv4Address
	}
	return def, true
}

// MachineType is the provider's own machine type for placement.machineType name: for gce
// the gce.machineTypes entry it names (e2-small for small), for hcloud and kvm2 the name
// itself; "" for a gce name the entry does not list.
func (pc ProviderConfig) MachineType(name string) string {
	if pc.Type == TypeGCE {
		if pc.GCE == nil {
			return ""
		}
		return pc.GCE.MachineTypes[name]
	}
	return name
}

// HasIPv4Address reports whether the entry's instances each hold an external IPv4
// address that is billed: gce's unless gce.externalIP is false, hcloud's primary IPv4
// always, none for kvm2 (addresses of the admin's own network).
func (pc ProviderConfig) HasIPv4Address() bool {
	switch pc.Type {
	case TypeGCE:
		return pc.GCE != nil && pc.GCE.HasExternalIP()
	case TypeHCloud:
		return true
	}
	return false
}

// Hourly is what a Proxy of this entry with placement.machineType name costs per hour,
// by PriceTable; false when it has no price for it.
func (pc ProviderConfig) Hourly(name string) (v1alpha1.Cost, bool) {
	table, ok := pc.PriceTable()
	if !ok {
		return v1alpha1.Cost{}, false
	}
	return table.Hourly(pc.MachineType(name), pc.HasIPv4Address())
}

// DefaultPrices is the default price table of a provider type, a fresh copy; false for
// a type without one (kvm2, kvm). The tables are list prices at a date, documented in
// docs/gce-provider.md and docs/hcloud-provider.md, "Costs": override them with the
// prices you pay.
func DefaultPrices(typ string) (Prices, bool) {
	var def Prices
	switch typ {
	case TypeGCE:
		def = defaultGCEPrices
	case TypeHCloud:
		def = defaultHCloudPrices
	default:
		return Prices{}, false
	}
	def.MachineTypes = maps.Clone(def.MachineTypes)
	return def, true
}

// defaultGCEPrices: Compute Engine on-demand list prices in us-central1 (Iowa), USD per
// hour, as Google listed them in 2025; an external IPv4 address in use by a standard VM
// costs 0.005 an hour. Spot VMs, committed-use and sustained-use discounts and other
// regions are priced differently: override.
var defaultGCEPrices = Prices{
	Currency: "USD",
	MachineTypes: map[string]Price{
		"e2-micro":       "0.008376",
		"e2-small":       "0.016751",
		"e2-medium":      "0.033503",
		"e2-standard-2":  "0.067006",
		"e2-standard-4":  "0.134012",
		"e2-highcpu-2":   "0.049468",
		"n1-standard-1":  "0.0475",
		"n2-standard-2":  "0.097118",
		"n2d-standard-2": "0.084492",
		"t2d-standard-1": "0.042246",
	},
	IPv4Address: "0.005",
}

// defaultHCloudPrices: Hetzner Cloud's list prices per hour in EUR, without VAT, for its
// locations in Germany and Finland (fsn1, nbg1, hel1), as Hetzner listed them in early
// 2025; the primary IPv4 costs 0.50 a month, 0.0008 an hour. Other locations (ash, hil,
// sin), newer server types and later price changes: override.
var defaultHCloudPrices = Prices{
	Currency: "EUR",
	MachineTypes: map[string]Price{
		"cx22":  "0.006",
		"cx32":  "0.0109",
		"cx42":  "0.0263",
		"cx52":  "0.0519",
		"cpx11": "0.007",
		"cpx21": "0.0121",
		"cpx31": "0.0218",
		"cpx41": "0.0403",
		"cpx51": "0.0879",
		"cax11": "0.006",
		"cax21": "0.0104",
		"cax31": "0.02",
		"cax41": "0.0392",
	},
	IPv4Address: "0.0008",
}
