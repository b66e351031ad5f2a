package discovery

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/equality"
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
}

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
	bump := func() { s.gen.Add(1) }
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
	if oka != okb {
		return false
	}
	return ea.Name == eb.Name && ea.Namespace == eb.Namespace && ea.URL == eb.URL && ea.Mode == eb.Mode &&
		ea.Provider == eb.Provider && ea.Region == eb.Region && ea.Zone == eb.Zone && ea.Pool == eb.Pool &&
		ea.Healthy == eb.Healthy && ea.EgressIP == eb.EgressIP && ea.urlIPv6 == eb.urlIPv6 && maps.Equal(ea.Labels, eb.Labels) &&
		equality.Semantic.DeepEqual(ea.auth, eb.auth) && equality.Semantic.DeepEqual(ea.cooldowns, eb.cooldowns)
}

// EntryFor is how a Proxy appears in the API; ok is false for a Proxy without an address.
// A proxy counts as healthy only while the health engine holds it Ready, it is not
// being deleted (a Ready proxy that the reconciler is replacing is not handed out), it
// is not cordoned and no crawler's unreachable report waits for a probe to answer it
// (status.unreachable newer than status.unreachableProbe). Pool is the ProxyPool that controls it, if any.
func EntryFor(px *v1alpha1.Proxy) (Entry, bool) {
	st := &px.Status
	if st.IP == "" {
		return Entry{}, false
	}
	port := px.Spec.Port
	if port == 0 {
		port = 3128
	}
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
		Healthy: st.Healthy && st.Phase == v1alpha1.PhaseReady && px.DeletionTimestamp == nil &&
			px.Annotations[v1alpha1.CordonAnnotation] != "true" && !bans.UnreachableOpen(st),
		EgressIP: st.EgressIP,
		Labels:   lbl,
		urlIPv6:  urlIPv6(st.IPv6, port),
	}, true
}

// urlIPv6 is the proxy's URL over its IPv6 address, or "" without one.
func urlIPv6(ip string, port int32) string {
	if ip == "" {
		return ""
	}
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(int(port)))
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
