package discovery

import (
	"cmp"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Entry is one proxy as the discovery API shows it.
type Entry struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	URL       string            `json:"url"`
	Mode      string            `json:"mode,omitempty"`
	Provider  string            `json:"provider,omitempty"`
	Region    string            `json:"region,omitempty"`
	Zone      string            `json:"zone,omitempty"`
	Pool      string            `json:"pool,omitempty"`
	Healthy   bool              `json:"healthy"`
	EgressIP  string            `json:"egressIP,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`

	// auth is what ?credentials=true needs of the Proxy (identity, mode,
	// spec.proxy.basicAuth, status.credentialsSecret), nil when its proxy demands no
	// credentials; never served.
	auth *v1alpha1.Proxy
	// cooldowns is status.cooldowns, for ?domain=; never served.
	cooldowns []v1alpha1.ProxyCooldown
	// urlIPv6 is the URL over the proxy's IPv6 address (status.ipv6), "" without one;
	// ?ipFamily=6 serves it as url.
	urlIPv6 string
}

// item is an Entry with the per-request work done ahead of time: its JSON encoding,
// its URL line and its rendezvous seed.
type item struct {
	Entry
	json []byte // the object, as it appears inside the list
	obj  []byte // the object and a newline, as pick serves it
	line []byte
	seed uint64
	idx  int // its index in Snapshot.items
	ns   int // the index of its namespace in Snapshot.namespaces
	// egressSeed seeds the proxy's egress identity: its egress address when known,
	// else seed (an identity of its own).
	egressSeed uint64
}

// Snapshot is an immutable view of every published proxy, sorted by namespace and name.
// It is built once per change of the underlying cache and shared by all requests.
type Snapshot struct {
	items []item
	// namespaces is the items' namespaces, each once, in order: what a caller's access
	// is worked out over (authz.go).
	namespaces []string
	// The bodies of the two most frequent requests (no filter, healthy only).
	healthyJSON, healthyText []byte
	// For feedback and ?domain= (feedback_handler.go, domain_cooling.go): items by
	// namespace/name and by URL, the items with a cooldown by site, and the number of
	// healthy items.
	byName, byURL map[string]*item
	bySite        map[string][]*item
	// cooling caches siteCooling's answers by site (domain_cooling.go).
	cooling sync.Map
	// all is every item, in order: what a request without ?domain= scans. noneCooling
	// is siteCooling's answer for a site no item has a cooldown for: all are candidates.
	all         []*item
	noneCooling *siteCool
	// egressOrder is every item by egressKey, then by its score for its egress identity
	// (highest first), then in order: what rotate walks.
	egressOrder []*item
	healthy     int
	// ipv6 is the snapshot ?ipFamily=6 answers from: the proxies with an IPv6 address,
	// each with its IPv6 URL as url.
	ipv6 *Snapshot
}

// NewSnapshot builds a snapshot from entries; it takes ownership of the slice.
func NewSnapshot(entries []Entry) *Snapshot {
	var v6 []Entry
	for _, e := range entries {
		if e.urlIPv6 != "" {
			e.URL, e.urlIPv6 = e.urlIPv6, ""
			v6 = append(v6, e)
		}
	}
	s := newSnapshot(entries)
	s.ipv6 = newSnapshot(v6)
	// Feedback names a proxy by the URL it was handed, of either family.
	for i := range s.ipv6.items {
		it := &s.ipv6.items[i]
		if u := strings.ToLower(it.URL); s.byURL[u] == nil {
			s.byURL[u] = s.byName[it.Namespace+"/"+it.Name]
		}
	}
	return s
}

// family is the snapshot that answers for IP family 4 or 6.
func (s *Snapshot) family(ipv6 bool) *Snapshot {
	if ipv6 {
		return s.ipv6
	}
	return s
}

func newSnapshot(entries []Entry) *Snapshot {
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Namespace != entries[j].Namespace {
			return entries[i].Namespace < entries[j].Namespace
		}
		return entries[i].Name < entries[j].Name
	})
	s := &Snapshot{items: make([]item, len(entries)), all: make([]*item, len(entries))}
	for i, e := range entries {
		s.all[i] = &s.items[i]
		b, err := json.Marshal(e)
		if err != nil { // a struct of strings, bools and a string map cannot fail
			panic(err)
		}
		s.items[i] = item{Entry: e, json: b, obj: append(b[:len(b):len(b)], '\n'), line: []byte(e.URL + "\n"), seed: nodeSeed(e.Namespace + "/" + e.Name), idx: i}
		if i == 0 || e.Namespace != entries[i-1].Namespace {
			s.namespaces = append(s.namespaces, e.Namespace)
		}
		s.items[i].ns = len(s.namespaces) - 1
		s.items[i].egressSeed = s.items[i].seed
		if e.EgressIP != "" {
			s.items[i].egressSeed = nodeSeed(e.EgressIP)
		}
	}
	f := &filter{}
	s.healthyJSON = s.appendJSON(nil, f)
	s.healthyText = s.appendText(nil, f)
	s.noneCooling = &siteCool{cands: s.all}
	s.egressOrder = slices.Clone(s.all)
	keys := make([]string, len(s.items)) // by item index
	for i := range s.items {
		keys[i] = egressKey(&s.items[i])
	}
	slices.SortStableFunc(s.egressOrder, func(a, b *item) int {
		if c := strings.Compare(keys[a.idx], keys[b.idx]); c != 0 {
			return c
		}
		return cmp.Compare(score(b.egressSeed, b.seed), score(a.egressSeed, a.seed))
	})
	s.indexFeedback()
	return s
}

// excluded is the set of the items of the snapshot for family fam (s.family) that refs
// name, by URL of either family or namespace/name; nil when refs name none.
func (s *Snapshot) excluded(refs []string, fam *Snapshot) map[*item]bool {
	var out map[*item]bool
	for _, ref := range refs {
		it := s.proxyByRef(ref)
		if it == nil {
			continue
		}
		if it = fam.byName[it.Namespace+"/"+it.Name]; it == nil {
			continue
		}
		if out == nil {
			out = map[*item]bool{}
		}
		out[it] = true
	}
	return out
}

// Len is the number of proxies in the snapshot, healthy or not.
func (s *Snapshot) Len() int { return len(s.items) }

// filter is a parsed query. Empty strings match everything.
type filter struct {
	namespace, provider, zone, region string
	pool                              string          // the ProxyPool controlling the proxy
	selector                          labels.Selector // nil matches everything
	anyHealth                         bool            // include unhealthy proxies
	unhealthyOnly                     bool
	// site, from ?domain=, leaves out the proxies cooling for it at now.
	site string
	now  time.Time
	// cands, once candsSet (Snapshot.saturation), is the snapshot's items that are not
	// cooling for site at now, in order: a request with ?domain= looks at these alone,
	// and match no longer asks about the site. Until then match asks each item.
	cands    []*item
	candsSet bool
	// only, when not nil, admits only these items (?distinctEgress=true: one per
	// egress identity, chosen by distinctEgress).
	only map[*item]struct{}
	// nsAllowed, when not nil, admits only the items whose namespace's bit (by index
	// in Snapshot.namespaces) is set: the namespaces the caller may read (authz.go).
	nsAllowed []uint64
	// exclude, when not nil, leaves these items out (?exclude=).
	exclude map[*item]bool
}

func (f *filter) empty() bool {
	return f.namespace == "" && f.provider == "" && f.zone == "" && f.region == "" && f.pool == "" &&
		f.selector == nil && !f.anyHealth && !f.unhealthyOnly && f.site == "" && f.only == nil && f.nsAllowed == nil && f.exclude == nil
}

func (f *filter) match(it *item) bool {
	switch {
	case f.unhealthyOnly && it.Healthy,
		!f.anyHealth && !f.unhealthyOnly && !it.Healthy,
		f.namespace != "" && f.namespace != it.Namespace,
		f.provider != "" && f.provider != it.Provider,
		f.zone != "" && f.zone != it.Zone,
		f.region != "" && f.region != it.Region,
		f.pool != "" && f.pool != it.Pool,
		f.nsAllowed != nil && f.nsAllowed[it.ns>>6]&(1<<(uint(it.ns)&63)) == 0:
		return false
	}
	if f.site != "" && !f.candsSet && it.coolingFor(f.site, f.now) {
		return false
	}
	if f.only != nil {
		if _, ok := f.only[it]; !ok {
			return false
		}
	}
	if f.exclude[it] {
		return false
	}
	return f.selector == nil || f.selector.Matches(labels.Set(it.Labels))
}

// scan is the items a request filtered by f looks at, in snapshot order: for a
// ?domain= request whose site's cooling proxies are worked out, the others; else all.
// Every item f matches is among them.
func (s *Snapshot) scan(f *filter) []*item {
	if f.candsSet {
		return f.cands
	}
	return s.all
}

// appendJSON appends {"count":n,"proxies":[...]} for the items f matches.
func (s *Snapshot) appendJSON(b []byte, f *filter) []byte {
	n := 0
	for _, it := range s.scan(f) {
		if f.match(it) {
			n++
		}
	}
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"proxies":[`...)
	first := true
	for _, it := range s.scan(f) {
		if f.match(it) {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, it.json...)
		}
	}
	return append(b, "]}\n"...)
}

// appendText appends one proxy URL per line for the items f matches.
func (s *Snapshot) appendText(b []byte, f *filter) []byte {
	for _, it := range s.scan(f) {
		if f.match(it) {
			b = append(b, it.line...)
		}
	}
	return b
}

// matching returns the items f matches.
func (s *Snapshot) matching(f *filter) []*item {
	var out []*item
	for _, it := range s.scan(f) {
		if f.match(it) {
			out = append(out, it)
		}
	}
	return out
}

// pick returns the proxy that wins key among the items f matches, or nil when none
// matches: the egress identity with the highest score for key, then among the proxies
// of that identity the one with the highest score (rendezvous.go). Ties go to the
// earlier item, so the answer is deterministic.
func (s *Snapshot) pick(key string, f *filter, skip map[*item]bool) *item {
	k := hashString(key)
	var best *item
	var bestIdentity, bestScore uint64
	for _, it := range s.scan(f) {
		if !f.match(it) || skip[it] {
			continue
		}
		id := score(k, it.egressSeed)
		switch {
		case best == nil || id > bestIdentity:
			best, bestIdentity, bestScore = it, id, score(k, it.seed)
		case id == bestIdentity && it.egressSeed == best.egressSeed:
			if sc := score(k, it.seed); sc > bestScore {
				best, bestScore = it, sc
			}
		}
	}
	return best
}

// distinctEgress is the set of items ?distinctEgress=true admits among those f matches:
// for each egress identity, the proxy of that identity with the highest score for the
// identity itself. The choice stays the same from request to request while the set does,
// and a proxy joining an address displaces the chosen one only if it outscores it.
func (s *Snapshot) distinctEgress(f *filter) map[*item]struct{} {
	best := s.bestPerEgress(f, nil)
	out := make(map[*item]struct{}, len(best))
	for _, c := range best {
		out[c.it] = struct{}{}
	}
	return out
}

// egressChoice is the proxy standing for one egress identity.
type egressChoice struct {
	it    *item
	score uint64
}

// bestPerEgress is, for each egress identity among the items f matches less skip, the
// proxy of that identity with the highest score for the identity itself.
func (s *Snapshot) bestPerEgress(f *filter, skip map[*item]bool) map[uint64]egressChoice {
	best := map[uint64]egressChoice{}
	for _, it := range s.scan(f) {
		if !f.match(it) || skip[it] {
			continue
		}
		sc := score(it.egressSeed, it.seed)
		if c, ok := best[it.egressSeed]; !ok || sc > c.score {
			best[it.egressSeed] = egressChoice{it, sc}
		}
	}
	return best
}
