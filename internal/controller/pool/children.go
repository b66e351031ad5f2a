package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// poolScope is one reconcile of one pool: what was read and what was decided.
type poolScope struct {
	// inherited: children handed over by remediation whose record a new child of this
	// pass took (inheritRecord).
	inherited map[string]bool
	pool      *v1alpha1.ProxyPool
	base      *v1alpha1.ProxyPool
	now       time.Time
	hash      string
	replicas  int32
	surge     int32
	unavail   int32
	// children are the pool's Proxies, by name, each with its classification.
	children []scopedChild
	// spread: the entries' effective placements and whether each can be used.
	placements []placement
	usable     []bool
	// placementProblem is the PlacementValid condition's reason and message when false.
	placementReason, placementMessage string
	plan                              plan
	// specErr is a spec the API server accepted but the controller cannot use.
	specErr error
	// credErr: the template's basic-auth Secret could not be read, so the template hash
	// is unknown; the pool creates and deletes nothing.
	credErr  error
	maxAge   time.Duration
	jitter   float64
	deadline time.Duration // progressDeadlineSeconds
	// progressAt is when the pool last saw progress (status.lastProgressTime).
	progressAt time.Time
	// egress: the WireGuard configurations to hand out (spec.egress.wireguard), or nil.
	egress *poolEgress
}

// placement is where a child goes: its provider and zone.
type placement struct{ provider, zone string }

func (p placement) String() string {
	var parts []string
	if p.provider != "" {
		parts = append(parts, "provider "+p.provider)
	}
	if p.zone != "" {
		parts = append(parts, "zone "+p.zone)
	}
	return strings.Join(parts, ", ")
}

// TemplateHash is the hash of a pool template without basic-auth credentials that
// labels the children made from it.
func TemplateHash(t *v1alpha1.ProxyTemplate) string { return templateHash(t, "") }

// templateHash is the hash of t and, when the template names a basic-auth Secret,
// credDigest: the slow digest (proxyconfig.CredentialsDigest) of the credentials that
// Secret holds, so that a rotated password rolls the pool like any template change.
func templateHash(t *v1alpha1.ProxyTemplate, credDigest string) string {
	if t.Spec.Remediation != nil {
		// Remediation's timeouts are read from the pool's template by each child's
		// reconcile: changing them replaces no child.
		c := *t
		c.Spec.Remediation = nil
		t = &c
	}
	b, err := json.Marshal(t)
	if err != nil { // strings, maps and numbers only
		panic(err)
	}
	if credDigest != "" {
		b = append(b, "\ncredentials "+credDigest...)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// DefaultProgressDeadline is progressDeadlineSeconds when unset (the API server's default).
const DefaultProgressDeadline = 600 * time.Second

// poolCredentialsDigest is the digest of the credentials the template's basic-auth
// Secret holds, read as the Proxy reconciler reads them for a child; "" without
// spec.proxy.basicAuth.
func (r *ProxyPoolReconciler) poolCredentialsDigest(ctx context.Context, pool *v1alpha1.ProxyPool) (string, error) {
	t := &pool.Spec.Template.Spec
	if t.Proxy == nil || t.Proxy.BasicAuth == nil {
		return "", nil
	}
	probe := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: pool.Name, Namespace: pool.Namespace}, Spec: *t.DeepCopy()}
	probe.Spec.Mode = v1alpha1.ProxyModeManaged
	creds, err := proxyconfig.SecretCredentials{Reader: r.Client}.Credentials(ctx, probe)
	if err != nil {
		return "", fmt.Errorf("credentials of proxy pool %s/%s (spec.template.spec.proxy.basicAuth.secretRef %s): %w",
			pool.Namespace, pool.Name, t.Proxy.BasicAuth.SecretRef.Name, err)
	}
	if creds == nil {
		return "", nil
	}
	return proxyconfig.CredentialsDigest(*creds)
}

// scopedChild is one of the pool's Proxies and how this pass classified it.
type scopedChild struct {
	px *v1alpha1.Proxy
	poolChild
}

// classified is the children's classifications, in order: what planPool decides from.
func (s *poolScope) classified() []poolChild {
	out := make([]poolChild, len(s.children))
	for i := range s.children {
		out[i] = s.children[i].poolChild
	}
	return out
}

// proxies is the children's Proxies, in order.
func (s *poolScope) proxies() []*v1alpha1.Proxy {
	out := make([]*v1alpha1.Proxy, len(s.children))
	for i := range s.children {
		out[i] = s.children[i].px
	}
	return out
}

// readChildren reads the pool's children and classifies them.
func (r *ProxyPoolReconciler) readChildren(ctx context.Context, pool *v1alpha1.ProxyPool) (*poolScope, error) {
	s := &poolScope{pool: pool, base: pool.DeepCopy(), now: r.Clock.Now(), deadline: DefaultProgressDeadline}
	digest, err := r.poolCredentialsDigest(ctx, pool)
	switch {
	case err == nil:
		s.hash = templateHash(&pool.Spec.Template, digest)
	case errors.Is(err, proxyconfig.ErrSecretMissing), errors.Is(err, proxyconfig.ErrSecretKeyMissing), errors.Is(err, proxyconfig.ErrBadCredentials):
		// The user's to fix; the Secret watch wakes the pool. Children made now could not
		// start either, and replacing the old ones would take working proxies away.
		s.credErr = err
	default:
		return nil, err // a failed read: retried with backoff
	}
	if d := pool.Spec.ProgressDeadlineSeconds; d != nil && *d > 0 {
		s.deadline = time.Duration(*d) * time.Second
	}
	if pool.Spec.Replicas != nil {
		s.replicas = *pool.Spec.Replicas
	}
	ru := pool.Spec.Strategy.RollingUpdate
	if s.surge, s.unavail, err = resolveFenceposts(ru.MaxSurge, ru.MaxUnavailable, s.replicas); err != nil {
		s.specErr = err
	}
	if pool.Spec.Rotation.MaxAge != nil {
		s.maxAge = pool.Spec.Rotation.MaxAge.Duration
	}
	if s.jitter, err = parseJitter(pool.Spec.Rotation.Jitter); err != nil {
		s.specErr = err
	}
	r.resolvePlacements(s)

	list := &v1alpha1.ProxyList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return nil, fmt.Errorf("listing the children of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	for i := range list.Items {
		px := &list.Items[i]
		if !metav1.IsControlledBy(px, pool) {
			continue // labelled by hand, or a former pool's of the same name
		}
		s.children = append(s.children, scopedChild{px, s.classify(px)})
	}
	if err := r.readEgress(ctx, s); err != nil {
		return nil, err
	}
	s.trackProgress()
	return s, nil
}

// resolvePlacements checks the template's provider and every spread entry against the
// providers config, and marks which entries children may go to.
func (r *ProxyPoolReconciler) resolvePlacements(s *poolScope) {
	spec := &s.pool.Spec
	base := placement{provider: spec.Template.Spec.Provider, zone: spec.Template.Spec.Placement.Zone}
	entries := spec.Spread
	if len(entries) == 0 {
		entries = []v1alpha1.PoolSpreadEntry{{Weight: 1}}
	}
	var problems []string
	for i, e := range entries {
		p := base
		if e.Provider != "" {
			p.provider = e.Provider
		}
		if e.Zone != "" {
			p.zone = e.Zone
		}
		s.placements = append(s.placements, p)
		what := "spec.template"
		if len(spec.Spread) > 0 {
			what = fmt.Sprintf("spec.spread[%d] (%s)", i, p)
		}
		zones, ok := r.Zones[p.provider]
		switch {
		case !ok:
			s.usable = append(s.usable, false)
			problems = append(problems, fmt.Sprintf("%s: provider %q is not in the providers config", what, p.provider))
			if s.placementReason == "" {
				s.placementReason = v1alpha1.PoolReasonUnknownProvider
			}
		case p.zone != "" && len(zones) > 0 && !slices.Contains(zones, p.zone):
			s.usable = append(s.usable, false)
			problems = append(problems, fmt.Sprintf("%s: zone %q is not one of provider %s's zones (%s)", what, p.zone, p.provider, strings.Join(zones, ", ")))
			if s.placementReason == "" {
				s.placementReason = v1alpha1.PoolReasonUnknownZone
			}
		default:
			s.usable = append(s.usable, true)
		}
	}
	s.placementMessage = strings.Join(problems, "; ")
}

// weights are the spread entries' weights (1 for the template's own placement).
func (s *poolScope) weights() []int32 {
	if len(s.pool.Spec.Spread) == 0 {
		return []int32{1}
	}
	w := make([]int32, len(s.pool.Spec.Spread))
	for i, e := range s.pool.Spec.Spread {
		w[i] = max(e.Weight, 1)
	}
	return w
}

// entryOf is the index of the usable spread entry px is placed on, or -1.
func (s *poolScope) entryOf(px *v1alpha1.Proxy) int {
	at := placement{provider: px.Spec.Provider, zone: px.Spec.Placement.Zone}
	for i, p := range s.placements {
		if s.usable[i] && p == at {
			return i
		}
	}
	return -1
}

func (s *poolScope) classify(px *v1alpha1.Proxy) poolChild {
	st := &px.Status
	c := poolChild{
		name:     px.Name,
		created:  bornAt(px),
		deleting: !px.DeletionTimestamp.IsZero(),
		// While the template's Secret cannot be read the hash is unknown: nothing is
		// replaced for it then.
		upToDate: (s.credErr != nil || px.Labels[v1alpha1.TemplateHashLabel] == s.hash) && s.entryOf(px) >= 0,
		outdated: meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionConfigOutdated),
		cordoned: px.Annotations[v1alpha1.CordonAnnotation] == "true",
		failed:   st.Phase == v1alpha1.PhaseFailed,
		// Remediation's replacement: the child goes once its successor is available.
		remediate: px.Annotations[common.RemediationReplaceAnnotation] != "",
		ready:     st.Phase == v1alpha1.PhaseReady && st.Healthy,
	}
	if c.ready && !c.cordoned && !c.deleting {
		c.available = !s.now.Before(readySince(px).Add(s.minReady()))
	}
	// Only a child that has been Ready is rotated; one that never was within the
	// progress deadline of its birth is stuck, whatever its age; one still within it is
	// booting and left alone.
	everReady := c.ready || hasBeenReady(px)
	c.stuck = !everReady && !c.failed && !c.deleting && !s.now.Before(c.created.Add(s.deadline))
	if s.maxAge > 0 && everReady {
		c.expired = !s.now.Before(rotationDeadline(c.created, string(px.UID), s.maxAge, s.jitter))
	}
	return c
}

// hasBeenReady: the health engine has had a successful probe through px at some point
// (it sets probeLatencyMilliseconds on each success and leaves it on failures).
func hasBeenReady(px *v1alpha1.Proxy) bool {
	return px.Status.ProbeLatencyMilliseconds > 0 ||
		meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionHealthy)
}

// bornAt is when the pool made px: its born annotation, else its creation time.
func bornAt(px *v1alpha1.Proxy) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, px.Annotations[v1alpha1.BornAnnotation]); err == nil {
		return t
	}
	return px.CreationTimestamp.Time
}

func (s *poolScope) minReady() time.Duration {
	return time.Duration(s.pool.Spec.MinReadySeconds) * time.Second
}

// readySince is when px last became healthy (its Healthy condition's transition).
func readySince(px *v1alpha1.Proxy) time.Time {
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c != nil && c.Status == metav1.ConditionTrue {
		return c.LastTransitionTime.Time
	}
	return px.CreationTimestamp.Time
}

// act carries out the plan: deletions first (they make room under the surge bound),
// then creations.
func (r *ProxyPoolReconciler) act(ctx context.Context, s *poolScope) error {
	if s.specErr != nil || s.credErr != nil {
		return nil // reported in status; a spec or Secret change wakes the pool again
	}
	if !slices.Contains(s.usable, true) {
		// Nowhere to put a replacement: leave every child as it is (PlacementValid says why).
		return nil
	}
	s.plan = planPool(s.classified(), s.replicas, s.surge, s.unavail, s.pool.Spec.Deletion.Order, string(s.pool.UID))
	log := ctrl.LoggerFrom(ctx)
	for _, name := range s.plan.delete {
		i := slices.IndexFunc(s.children, func(c scopedChild) bool { return c.px.Name == name })
		px := s.children[i].px
		why := deletionCause(&s.children[i].poolChild, s.replicas, s.deadline)
		uid := px.UID
		if err := r.Client.Delete(ctx, px, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting child proxy %s/%s of pool %s: %w", px.Namespace, px.Name, s.pool.Name, err)
		}
		log.Info("deleted pool child", "child", px.Name, "cause", why)
		r.event(s.pool, corev1.EventTypeNormal, EventChildDeleted, common.ActionDelete, "deleted child %s: %s", px.Name, why)
		s.children[i].deleting = true
		s.children[i].available = false
		// Published as terminating in this same pass.
		if px.DeletionTimestamp.IsZero() {
			px.DeletionTimestamp = ptr.To(metav1.NewTime(s.now))
		}
	}
	if s.plan.create == 0 {
		if s.plan.stalled && !s.deadlineExceeded() && !s.wasStalled() {
			r.event(s.pool, corev1.EventTypeWarning, EventPoolStalled, common.ActionReconcile, "%s", s.stalledMessage())
		}
		return nil
	}
	var batch []*v1alpha1.Proxy
	var at []placement
	counts := s.entryCounts()
	weights := s.weights()
	create := s.egress.capCreate(s.plan.create) // EgressExhausted says why not all
	for n := 0; n < create; n++ {
		e := pickSpread(counts, weights, s.usable)
		if e < 0 {
			break // PlacementValid says why
		}
		px, err := r.newChild(s, s.placements[e])
		if err != nil {
			return err
		}
		s.egress.assign(px)
		counts[e]++
		batch, at = append(batch, px), append(at, s.placements[e])
	}
	return r.createChildren(ctx, s, batch, at)
}

// createChildren creates the children with a slow start and no barrier between batches:
// one create first, and one more in flight for every create that succeeds, up to
// createBatchLimit at once (so 1, then 2, 4, 8, … at a time, as cluster-api's and the
// ReplicaSet controller's slow-start batches do). The first failure stops it: a provider
// quota or an admission webhook that refuses one child refuses the rest too, so a bad
// template costs one request, and the pass returns once the creates in flight are
// answered. A finished create starts the next at once rather than waiting for its whole
// batch, so a pool of a thousand is made at the API server's pace, not its slowest
// answer's. What a stopped pass did not create is the next pass's to decide on, from
// its own live list.
func (r *ProxyPoolReconciler) createChildren(ctx context.Context, s *poolScope, children []*v1alpha1.Proxy, at []placement) error {
	log := ctrl.LoggerFrom(ctx)
	type answer struct {
		i   int
		err error
	}
	answers := make(chan answer)
	var errs []error
	window, inFlight, next := 1, 0, 0
	for inFlight > 0 || (len(errs) == 0 && next < len(children)) {
		for ; len(errs) == 0 && inFlight < window && next < len(children); next, inFlight = next+1, inFlight+1 {
			go func(i int) { answers <- answer{i, r.Client.Create(ctx, children[i])} }(next)
		}
		a := <-answers
		inFlight--
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		window = min(window+1, createBatchLimit)
		px := children[a.i]
		log.Info("created pool child", "child", px.Name, "placement", at[a.i].String())
		r.event(s.pool, corev1.EventTypeNormal, EventChildCreated, common.ActionCreate, "created child %s (%s)", px.Name, at[a.i])
		s.children = append(s.children, scopedChild{px, s.classify(px)})
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("creating child proxies of pool %s/%s: %w", s.pool.Namespace, s.pool.Name, err)
	}
	return nil
}

// createBatchLimit is the most creates of one pass in flight at once.
const createBatchLimit = 32

// entryCounts counts the children each spread entry holds that the pool keeps.
func (s *poolScope) entryCounts() []int {
	counts := make([]int, len(s.placements))
	for _, c := range s.children {
		if !c.good() {
			continue
		}
		if e := s.entryOf(c.px); e >= 0 {
			counts[e]++
		}
	}
	return counts
}

// newChild builds a child Proxy from the template, placed at p, named <pool>-<5 random>.
func (r *ProxyPoolReconciler) newChild(s *poolScope, p placement) (*v1alpha1.Proxy, error) {
	t := &s.pool.Spec.Template
	labels := maps.Clone(t.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1alpha1.PoolLabel] = s.pool.Name
	labels[v1alpha1.TemplateHashLabel] = s.hash
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: s.pool.Name + "-",
			Namespace:    s.pool.Namespace,
			Labels:       labels,
			Annotations:  maps.Clone(t.Metadata.Annotations),
		},
		Spec: *t.Spec.DeepCopy(),
	}
	if px.Annotations == nil {
		px.Annotations = map[string]string{}
	}
	delete(px.Annotations, v1alpha1.CordonAnnotation)
	delete(px.Annotations, common.RemediationReplaceAnnotation)
	delete(px.Annotations, remediation.RecordAnnotation)
	if rec := s.inheritRecord(); rec != "" {
		// The successor of a child remediation replaces keeps its record: the attempt
		// count and the growing waits go on rather than start over.
		px.Annotations[remediation.RecordAnnotation] = rec
	}
	px.Annotations[v1alpha1.BornAnnotation] = s.now.UTC().Format(time.RFC3339Nano)
	px.Spec.Provider = p.provider
	px.Spec.Placement.Zone = p.zone
	if err := controllerutil.SetControllerReference(s.pool, px, r.Scheme); err != nil {
		return nil, fmt.Errorf("owner reference on a child of pool %s: %w", s.pool.Name, err)
	}
	return px, nil
}

// nextDeadline is how long until the next child becomes available or reaches its
// rotation deadline, when one will.
func (s *poolScope) nextDeadline() (time.Duration, bool) {
	var next time.Time
	consider := func(t time.Time) {
		if t.After(s.now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for i := range s.children {
		c, px := &s.children[i], s.children[i].px
		if c.deleting {
			continue
		}
		if c.ready && !c.available && !c.cordoned {
			consider(readySince(px).Add(s.minReady()))
		}
		if s.maxAge > 0 && !c.expired && (c.ready || hasBeenReady(px)) {
			consider(rotationDeadline(c.created, string(px.UID), s.maxAge, s.jitter))
		}
		if !c.ready && !c.stuck && !c.failed && !hasBeenReady(px) {
			consider(c.created.Add(s.deadline)) // when it counts as stuck
		}
	}
	if !s.complete() && !s.progressAt.IsZero() {
		consider(s.progressAt.Add(s.deadline)) // when the rollout counts as stalled
	}
	if next.IsZero() {
		return 0, false
	}
	return next.Sub(s.now), true
}

// inheritRecord is the remediation record the next new child inherits: that of a child
// remediation handed over for replacement (common.RemediationReplaceAnnotation) whose record no
// child made in this pass or after it has taken yet; "" when none.
func (s *poolScope) inheritRecord() string {
	for _, c := range s.children {
		px := c.px
		rec := px.Annotations[remediation.RecordAnnotation]
		if !c.remediate || c.deleting || rec == "" || s.inherited[px.Name] {
			continue
		}
		if s.recordTaken(rec) {
			continue
		}
		if s.inherited == nil {
			s.inherited = map[string]bool{}
		}
		s.inherited[px.Name] = true
		return rec
	}
	return ""
}

// recordTaken: a child not handed over already holds rec (a successor made in an earlier
// pass).
func (s *poolScope) recordTaken(rec string) bool {
	for _, c := range s.children {
		if !c.remediate && c.px.Annotations[remediation.RecordAnnotation] == rec {
			return true
		}
	}
	return false
}
