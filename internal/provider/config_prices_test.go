package provider

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// entry parses a providers config of one entry and returns it.
func entry(t *testing.T, doc string) ProviderConfig {
	t.Helper()
	cfg, err := ParseConfig([]byte(doc))
	if err != nil {
		t.Fatalf("parsing:\n%s\n%v", doc, err)
	}
	return cfg.Providers[0]
}

// wantCost fails unless pc prices placement.machineType name at want (a decimal) in
// currency.
func wantCost(t *testing.T, pc ProviderConfig, name, want, currency string) {
	t.Helper()
	c, ok := pc.Hourly(name)
	if !ok {
		t.Fatalf("%s %s: no cost, want %s %s", pc.Name, name, want, currency)
	}
	if string(c.Hourly) != want || c.Currency != currency {
		t.Errorf("%s %s: %s %s, want %s %s", pc.Name, name, c.Hourly, c.Currency, want, currency)
	}
}

func wantNoCost(t *testing.T, pc ProviderConfig, name string) {
	t.Helper()
	if c, ok := pc.Hourly(name); ok {
		t.Errorf("%s %s: cost %s %s, want none", pc.Name, name, c.Hourly, c.Currency)
	}
}

// kvmPriced is a kvm2 entry that passes every rule, ready for a prices block.
const kvmPriced = "providers:\n- name: k\n  type: kvm2\n  kvm2: {sshKeyFile: /k, insecureIgnoreHostKey: true, " +
	"machineTypes: {small: {vcpus: 1, memoryMiB: 1024}}, hosts: [{name: h, address: 'h:22', user: u, bridge: br0}]}\n"

const gcePriced = `
providers:
- name: g
  type: gce
  gce:
    project: my-proxies
    zones: [europe-west1-b]
    machineTypes: {small: e2-small, micro: e2-micro, big: c3-standard-4}
    images: {d: images/family/x}
`

// TestPricesDefaultTables: gce and hcloud price their common types from their default
// tables (a machine type plus one external IPv4), by the provider's own type name; a
// type the table lacks has no cost; kvm2 has no table at all.
func TestPricesDefaultTables(t *testing.T) {
	g := entry(t, gcePriced)
	wantCost(t, g, "small", "0.021751", "USD") // e2-small 0.016751 + IPv4 0.005
	wantCost(t, g, "micro", "0.013376", "USD")
	wantNoCost(t, g, "big")      // c3-standard-4 is not in the default table
	wantNoCost(t, g, "e2-small") // not a name of gce.machineTypes
	wantNoCost(t, g, "")

	noIP := entry(t, strings.Replace(gcePriced, "images: {d: images/family/x}", "images: {d: images/family/x}\n    externalIP: false", 1))
	wantCost(t, noIP, "small", "0.016751", "USD")

	h := entry(t, `
providers:
- name: h
  type: hcloud
  hcloud: {tokenFile: /t, locations: [fsn1], serverTypes: [cx22, cax11, cx23], images: [ubuntu-24.04]}
`)
	wantCost(t, h, "cx22", "0.0068", "EUR") // 0.006 + primary IPv4 0.0008
	wantCost(t, h, "cax11", "0.0068", "EUR")
	wantNoCost(t, h, "cx23")

	k := entry(t, kvmPriced)
	if _, ok := k.PriceTable(); ok {
		t.Error("a kvm2 entry without prices has a price table")
	}
	wantNoCost(t, k, "small")

	for _, typ := range []string{TypeGCE, TypeHCloud} {
		def, ok := DefaultPrices(typ)
		if !ok || len(def.Validate()) > 0 || len(def.MachineTypes) == 0 || def.IPv4Address == "" {
			t.Errorf("default table of %s: %+v, problems %v", typ, def, def.Validate())
		}
		def.MachineTypes["e2-small"] = "9"
		if again, _ := DefaultPrices(typ); again.MachineTypes["e2-small"] == "9" {
			t.Errorf("DefaultPrices(%s) hands out its table to be changed", typ)
		}
	}
}

// TestPricesOverride: a user's prices override the default table key by key, in its
// currency; a table in another currency replaces the default whole; a kvm2 entry is
// priced by its own table, without addresses.
func TestPricesOverride(t *testing.T) {
	g := entry(t, gcePriced+`  prices:
    currency: USD
    machineTypes: {e2-small: "0.0201", c3-standard-4: 0.2}
    ipv4Address: 0.0036
`)
	wantCost(t, g, "small", "0.0237", "USD")   // overridden, with the overridden address
	wantCost(t, g, "micro", "0.011976", "USD") // the default e2-micro, with the overridden address
	wantCost(t, g, "big", "0.2036", "USD")     // added

	eur := entry(t, gcePriced+"  prices: {currency: EUR, machineTypes: {e2-small: \"0.015\"}}\n")
	wantCost(t, eur, "small", "0.015", "EUR") // no default address price in EUR
	wantNoCost(t, eur, "micro")

	k := entry(t, kvmPriced+`  prices: {currency: CZK, machineTypes: {small: "0.35"}, ipv4Address: "1"}`)
	wantCost(t, k, "small", "0.35", "CZK")
	wantNoCost(t, k, "large")

	tiny := entry(t, gcePriced+"  prices: {currency: USD, machineTypes: {e2-micro: 0.0000001}}\n")
	wantCost(t, tiny, "micro", "0.0050001", "USD")
}

// TestPricesProblems: every rule of the prices block, each message naming the entry and
// the path inside the block.
func TestPricesProblems(t *testing.T) {
	const kvm = kvmPriced + "  prices: "
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"empty block", kvm + "{}\n", []string{
			`provider "k": prices: currency is required when prices are given (an ISO 4217 code such as USD or EUR)`}},
		{"currency format", kvm + "{currency: usd}\n", []string{
			`provider "k": prices.currency: "usd" is not a currency code (three upper-case letters of ISO 4217, such as USD or EUR)`}},
		{"currency symbol", kvm + "{currency: $}\n", []string{
			`provider "k": prices.currency: "$" is not a currency code (three upper-case letters of ISO 4217, such as USD or EUR)`}},
		{"not a price", kvm + "{currency: USD, machineTypes: {e2-small: abc, big: '1,5', cheap: '.5', k: 1Ki}}\n", []string{
			`provider "k": prices.machineTypes.big: "1,5" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`,
			`provider "k": prices.machineTypes.cheap: ".5" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`,
			`provider "k": prices.machineTypes.e2-small: "abc" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`,
			`provider "k": prices.machineTypes.k: "1Ki" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`}},
		{"too fine", kvm + "{currency: USD, machineTypes: {s: '0.0000000001'}}\n", []string{
			`provider "k": prices.machineTypes.s: "0.0000000001" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`}},
		{"negative", kvm + "{currency: USD, machineTypes: {s: -0.01}, ipv4Address: '-1'}\n", []string{
			`provider "k": prices.machineTypes.s: "-0.01" is negative: a price per hour is 0 or more`,
			`provider "k": prices.ipv4Address: "-1" is negative: a price per hour is 0 or more`}},
		{"not a number", kvm + "{currency: USD, ipv4Address: true}\n", []string{
			`provider "k": prices.ipv4Address: "true" is not a price per hour (a decimal such as 0.0168, at most 9 digits after the point)`}},
		{"bad key", kvm + "{currency: USD, machineTypes: {'a b': '1'}}\n", []string{
			`provider "k": prices.machineTypes: key "a b": only letters, digits, dots, dashes and underscores are allowed`}},
		{"unknown field", kvm + "{currency: USD, ipv4: '1'}\n", []string{
			`provider "k": prices: unknown field "ipv4"`}},
		{"gce alias", strings.TrimSuffix(gcePriced, "\n") + "\n  prices: {currency: USD, machineTypes: {small: '0.02', e2-micro: '0.01'}}\n", []string{
			`provider "g": prices.machineTypes.small: "small" is a name of gce.machineTypes; price the GCE machine type it stands for (e2-small)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.doc))
			if got := problems(err); !slices.Equal(got, c.want) {
				t.Errorf("problems:\n  got:  %q\n  want: %q", got, c.want)
			}
		})
	}
}

// TestDefaultPriceTablesInDocs: the default tables of docs/gce-provider.md and
// docs/hcloud-provider.md ("The default price table") are the code's, row for row.
func TestDefaultPriceTablesInDocs(t *testing.T) {
	rowRE := regexp.MustCompile("^\\| `([a-z0-9-]+)` \\| ([0-9.]+) \\|$")
	ipRE := regexp.MustCompile("^\\| [^|]*\\(`ipv4Address`[^|]*\\| ([0-9.]+) \\|$")
	for typ, doc := range map[string]string{TypeGCE: "gce-provider.md", TypeHCloud: "hcloud-provider.md"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "docs", doc))
		if err != nil {
			t.Fatal(err)
		}
		_, section, ok := strings.Cut(string(data), "### The default price table\n")
		if !ok {
			t.Fatalf("docs/%s has no section The default price table", doc)
		}
		got := Prices{MachineTypes: map[string]Price{}}
		for _, line := range strings.Split(section, "\n") {
			if m := rowRE.FindStringSubmatch(line); m != nil {
				got.MachineTypes[m[1]] = Price(m[2])
			} else if m := ipRE.FindStringSubmatch(line); m != nil {
				got.IPv4Address = Price(m[1])
			}
		}
		def, _ := DefaultPrices(typ)
		got.Currency = def.Currency
		if diff := cmp.Diff(def, got); diff != "" {
			t.Errorf("docs/%s's default table differs from the code's (-code +docs):\n%s", doc, diff)
		}
	}
}
