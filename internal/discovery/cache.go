package discovery

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// CacheSource serves snapshots built from the manager's informer cache. Every change the
// Proxy informer sees marks the snapshot stale; the next request rebuilds it with one List
// from memory. Requests between two changes share the same snapshot and do no API calls.
type CacheSource struct {
	reader client.Reader
	gen    atomic.Uint64 // bumped on every informer event

	mu  sync.Mutex // one rebuild at a time
	cur atomic.Pointer[built]
	// onChange is called after every change that makes a new snapshot (OnChange).
	onChange atomic.Pointer[func()]
}

// OnChange makes fn be called after every Proxy change that makes a new snapshot, once
// the next Snapshot call sees it (the gateway wakes its held requests with it). fn must
// not block. A later call replaces fn.
func (s *CacheSource) OnChange(fn func()) { s.onChange.Store(&fn) }

// built is a snapshot and the generation it was built at.
type built struct {
	snap *Snapshot
	gen  uint64
}

// NewCacheSource registers with c's Proxy informer (starting it with the cache) and
// reads Proxies through c.
func NewCacheSource(ctx context.Context, c cache.Cache) (*CacheSource, error) {
	inf, err := c.GetInformer(ctx, &v1alpha1.Proxy{})
	if err != nil {
		return nil, fmt.Errorf("discovery api: getting the proxy informer: %w", err)
	}
	s := &CacheSource{reader: c}
	s.gen.Store(1) // the first request builds the first snapshot
	bump := func() {
		s.gen.Add(1)
		if fn := s.onChange.Load(); fn != nil {
			(*fn)()
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { bump() },
		UpdateFunc: func(o, n any) {
			// The health engine rewrites every Proxy's status each round (lastProbeTime,
			// latency); only a change the API shows needs a new snapshot.
			op, ok1 := o.(*v1alpha1.Proxy)
			np, ok2 := n.(*v1alpha1.Proxy)
			if !ok1 || !ok2 || !sameEntry(op, np) {
				bump()
			}
		},
		DeleteFunc: func(any) { bump() },
	}); err != nil {
		return nil, fmt.Errorf("discovery api: watching proxies: %w", err)
	}
	return s, nil
}

// Snapshot returns the current snapshot, rebuilding it when the cache changed since.
func (s *CacheSource) Snapshot(ctx context.Context) (*Snapshot, error) {
	if b := s.cur.Load(); b != nil && b.gen == s.gen.Load() {
		return b.snap, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gen.Load()
	if b := s.cur.Load(); b != nil && b.gen == g { // another request rebuilt it meanwhile
		return b.snap, nil
	}
	var list v1alpha1.ProxyList
	// The objects are only read, never handed out or changed: skip the deep copy.
	if err := s.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing proxies from the cache: %w", err)
	}
	entries := make([]Entry, 0, len(list.Items))
	for i := range list.Items {
		if e, ok := EntryFor(&list.Items[i]); ok {
			entries = append(entries, e)
		}
	}
	// Tagged with g, read before the List: a change during the List has bumped gen past
	// g, so the next request rebuilds again.
	b := &built{snap: NewSnapshot(entries), gen: g}
	s.cur.Store(b)
	return b.snap, nil
}

// sameEntry reports whether a and b appear the same in the API.
func sameEntry(a, b *v1alpha1.Proxy) bool {
	ea, oka := EntryFor(a)
	eb, okb := EntryFor(b)
	return oka == okb && ea.equal(&eb)
}

// equal reports whether e and f are the same entry, compared as values: the comparable
// fields with one ==, the labels, credentials part and cooldowns by content.
// TestEntryEqualSeesEveryField changes each field of Entry in turn and fails for a field
// this leaves out.
func (e *Entry) equal(f *Entry) bool {
	return e.scalars() == f.scalars() && maps.Equal(e.Labels, f.Labels) &&
		sameAuth(e.auth, f.auth) && slices.EqualFunc(e.cooldowns, f.cooldowns, sameCooldown)
}

// entryScalars is the comparable part of an Entry.
type entryScalars struct {
	name, namespace, url, mode, provider, region, zone, pool, egressIP, urlIPv6 string
	healthy                                                                     bool
}

func (e *Entry) scalars() entryScalars {
	return entryScalars{e.Name, e.Namespace, e.URL, e.Mode, e.Provider, e.Region, e.Zone, e.Pool, e.EgressIP, e.urlIPv6, e.Healthy}
}

// sameAuth compares what authOf keeps of a Proxy.
func sameAuth(a, b *v1alpha1.Proxy) bool {
	if a == nil || b == nil {
		return a == b
	}
	pa, pb := a.Spec.Proxy, b.Spec.Proxy // authOf sets spec.proxy to basicAuth alone, or nil
	if (pa == nil) != (pb == nil) || (pa != nil && !ptrEqual(pa.BasicAuth, pb.BasicAuth)) {
		return false
	}
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID && a.Spec.Mode == b.Spec.Mode &&
		a.Status.CredentialsSecret == b.Status.CredentialsSecret
}

// sameCooldown compares two cooldowns field by field, their times as instants.
func sameCooldown(a, b v1alpha1.ProxyCooldown) bool {
	return a.Site == b.Site && a.Until.Equal(&b.Until) && a.Bans == b.Bans && a.LastOutcome == b.LastOutcome &&
		a.LastBanned.Equal(b.LastBanned)
}

// ptrEqual reports whether a and b are both nil or point to equal values.
func ptrEqual[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// EntryFor is how a Proxy appears in the API; ok is false for a Proxy without an address.
// A proxy counts as healthy only while bans.HandedOut holds: the health engine holds it
// Ready, it is not being deleted (a Ready proxy that the reconciler is replacing is not
// handed out), it is not cordoned and no crawler's unreachable report waits for a probe
// to answer it (status.unreachable newer than status.unreachableProbe). Pool is the
// ProxyPool that controls it, if any (v1alpha1.ControllingPool).
func EntryFor(px *v1alpha1.Proxy) (Entry, bool) {
	st := &px.Status
	if st.IP == "" {
		return Entry{}, false
	}
	port := px.Port()
	var lbl map[string]string
	if len(px.Labels) > 0 {
		lbl = make(map[string]string, len(px.Labels))
		for k, v := range px.Labels {
			lbl[k] = v
		}
	}
	return Entry{
		auth:      authOf(px),
		cooldowns: cooldownsOf(px),
		Name:      px.Name,
		Namespace: px.Namespace,
		URL:       "http://" + net.JoinHostPort(st.IP, strconv.Itoa(int(port))),
		Mode:      string(px.Spec.Mode),
		Provider:  px.Spec.Provider,
		Region:    px.Spec.Placement.Region,
		Zone:      px.Spec.Placement.Zone,
		Pool:      poolOf(px),
		Healthy:   bans.HandedOut(px),
		EgressIP:  st.EgressIP,
		Labels:    lbl,
		urlIPv6:   urlIPv6(st.IPv6, port),
	}, true
}

// urlIPv6 is the proxy's URL over its IPv6 address, or "" without one.
func urlIPv6(ip string, port int32) string {
	if ip == "" {
		return ""
	}
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(int(port)))
}

// poolOf is the name of the ProxyPool controlling px, or "".
func poolOf(px *v1alpha1.Proxy) string {
	ref, _ := v1alpha1.ControllingPool(px)
	return ref.Name
}

// authOf is the part of px its credentials lookup reads, or nil when its proxy demands no
// credentials: neither spec.proxy.basicAuth nor a snapshot of what its instance was built
// with (status.credentialsSecret).
func authOf(px *v1alpha1.Proxy) *v1alpha1.Proxy {
	hasRef := px.Spec.Proxy != nil && px.Spec.Proxy.BasicAuth != nil
	if !hasRef && px.Status.CredentialsSecret == "" {
		return nil
	}
	a := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: px.Namespace, Name: px.Name, UID: px.UID},
		Spec:       v1alpha1.ProxySpec{Mode: px.Spec.Mode},
		Status:     v1alpha1.ProxyStatus{CredentialsSecret: px.Status.CredentialsSecret},
	}
	if hasRef {
		a.Spec.Proxy = &v1alpha1.ProxyConfig{BasicAuth: px.Spec.Proxy.BasicAuth.DeepCopy()}
	}
	return a
}
