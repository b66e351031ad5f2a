package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// create asks the provider for the Proxy's instance (adopting one an earlier, cut-off
// attempt left behind), built from userData, and publishes it, with want as the hashes it
// was built from. First the credentials it is built with (creds, nil for none) are
// copied into the Proxy's snapshot. userData may hold the proxy's password: it goes to
// the provider and nowhere else.
func (r *ProxyReconciler) create(ctx context.Context, s *scope, p provider.Provider, want hashes, userData []byte, creds *proxyconfig.Credentials) (ctrl.Result, error) {
	px := s.px
	if err := r.syncSnapshot(ctx, s, creds); err != nil {
		if errors.Is(err, errSnapshotTaken) {
			return r.snapshotTaken(s, err), nil
		}
		return r.providerError(s, common.ActionCreate, err, true)
	}
	inst, res, err := r.provision(ctx, s, p, want.rendered, userData)
	if inst == nil {
		return res, err
	}
	px.Status.SpecHash, px.Status.RenderedHash = want.intent, want.rendered
	px.Status.ObservedReplace = px.Annotations[v1alpha1.ReplaceAnnotation]
	s.setConfigUpToDate()
	return r.publishInstance(s, *inst), nil
}

// restart asks the provider to start the Proxy's stopped instance as it was built: the
// request carries the rendered hash the instance is marked with, so the provider adopts
// it rather than building it again; hashes and snapshot stay as they are.
func (r *ProxyReconciler) restart(ctx context.Context, s *scope, p provider.Provider, userData []byte) (ctrl.Result, error) {
	inst, res, err := r.provision(ctx, s, p, s.px.Status.RenderedHash, userData)
	if inst == nil {
		return res, err
	}
	return r.publishInstance(s, *inst), nil
}

// provision runs the provider's Create for the Proxy with specHash as the instance's
// mark. It returns the instance, or nil and what the reconcile returns.
func (r *ProxyReconciler) provision(ctx context.Context, s *scope, p provider.Provider, specHash string, userData []byte) (*provider.Instance, ctrl.Result, error) {
	px := s.px
	name := px.InstanceName()
	switch {
	case ownedByOther(px):
		// A re-check: the Proxy stays Failed, with no phase flapping, until the Create succeeds.
		s.log.V(1).Info("checking a proxy failed on an instance of another owner again", "message", px.Status.Message)
	case s.base.Status.Phase == v1alpha1.PhaseProvisioning:
		// A repeat (after a pending, quota or transient result): the Proxy already shows
		// Provisioning, and what it shows stays until this Create's outcome, which is
		// written only if it differs. Announcing "creating" first would write the status
		// twice per retry, flipping the message and reason back and forth.
	default:
		msg := fmt.Sprintf("creating instance %s with provider %s", name, px.Spec.Provider)
		s.setPhase(v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning, msg)
		s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, msg)
		// A Create may take minutes (a first image download): show Provisioning meanwhile.
		if err := r.applyStatus(ctx, s); err != nil {
			return nil, ctrl.Result{}, err
		}
	}

	req := provider.CreateRequest{
		Name: name,
		UID:  string(px.UID),
		Placement: provider.Placement{
			Region:      px.Spec.Placement.Region,
			Zone:        px.Spec.Placement.Zone,
			MachineType: px.Spec.Placement.MachineType,
			Image:       px.Spec.Placement.Image,
		},
		CloudInit:    userData,
		Port:         px.Spec.Port,
		SourceRanges: sourceRanges(px),
		SpecHash:     specHash,
		Pool:         poolOf(px),
	}
	prog := r.newProgress(ctx, s)
	inst, err := p.Create(provider.WithProgress(ctx, prog.report), req)
	if latest := prog.stop(); latest != nil {
		s.written(latest)
	}
	if err != nil {
		res, err := r.providerError(s, common.ActionCreate, fmt.Errorf("creating instance %s: %w", name, err), true)
		return nil, res, err
	}
	return &inst, ctrl.Result{}, nil
}

// snapshotTaken shows that the snapshot's Secret name belongs to a Secret the Proxy does
// not control, and checks again every PendingRetry: nothing is written over it.
func (r *ProxyReconciler) snapshotTaken(s *scope, err error) ctrl.Result {
	px := s.px
	msg := err.Error()
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c == nil ||
		c.Reason != v1alpha1.ReasonCredentialsUnavailable || c.Message != msg {
		s.log.Info("proxy cannot keep its credentials snapshot", "error", msg)
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonCredentialsUnavailable, common.ActionReconcile, "%s", msg)
	}
	if px.Status.ProviderID == "" {
		s.setPhase(v1alpha1.PhasePending, v1alpha1.ReasonCredentialsUnavailable, msg)
	}
	px.Status.Message = msg
	s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, msg)
	return ctrl.Result{RequeueAfter: r.PendingRetry}
}

// providerError turns a provider error into status, an Event and a result, by class:
// permanent latches Failed, quota waits QuotaRetry off the backoff curve, pending (work
// the provider runs in the background, such as an image download) waits PendingRetry off
// the curve too and shows the work's progress, a transient error that says when a retry
// can succeed (provider.RetryAfter) waits that long, anything else goes back to
// controller-runtime for a retry with backoff. provisioning says the error kept the
// instance from being provisioned, so the Provisioned condition shows it.
func (r *ProxyReconciler) providerError(s *scope, action string, err error, provisioning bool) (ctrl.Result, error) {
	st := &s.px.Status
	switch {
	case errors.Is(err, errStaleRead):
		return ctrl.Result{}, err // not the provider's: Reconcile runs again
	case errors.Is(err, provider.ErrPending):
		// Not a failure: no Warning event, and the Provisioned condition carries the
		// progress with the provider's reason (ImageDownloading for kvm2).
		pr, _ := provider.PendingProgress(err)
		if pr.Reason == "" {
			pr.Reason = v1alpha1.ReasonProvisioning
		}
		if pr.Message == "" {
			pr.Message = err.Error()
		}
		msg := progressMessage(pr)
		s.log.V(1).Info("provider work pending; asking again", "op", action, "retryIn", r.PendingRetry,
			"reason", pr.Reason, "progress", msg)
		st.Phase, st.Message = v1alpha1.PhaseProvisioning, msg
		s.setProvisioned(metav1.ConditionFalse, pr.Reason, msg)
		return ctrl.Result{RequeueAfter: r.PendingRetry}, nil
	case errors.Is(err, provider.ErrOwnedByOther):
		// Permanent for this request, but the other owner's instance may go (orphan GC
		// deletes it once no Proxy owns it): check again later instead of latching.
		every := r.FailedRecheckInterval
		msg := fmt.Sprintf("%v; checked again every %s, and as soon as orphan GC deletes that instance", err, every)
		if !ownedByOther(s.px) {
			s.log.Info("proxy phase changed", "from", st.Phase, "to", v1alpha1.PhaseFailed, "reason", v1alpha1.ReasonOwnedByOther, "error", err.Error())
			s.event(corev1.EventTypeWarning, v1alpha1.ReasonOwnedByOther, action, "%s", msg)
		}
		st.Phase, st.Message = v1alpha1.PhaseFailed, msg
		s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, msg)
		return ctrl.Result{RequeueAfter: every}, nil
	case errors.Is(err, provider.ErrPermanent):
		if st.Phase != v1alpha1.PhaseFailed {
			s.log.Info("proxy phase changed", "from", st.Phase, "to", v1alpha1.PhaseFailed, "reason", v1alpha1.ReasonPermanentError, "error", err.Error())
		}
		st.Phase, st.Message = v1alpha1.PhaseFailed, err.Error()
		s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonPermanentError, err.Error())
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonPermanentError, action,
			"%v; the Proxy stays Failed until its spec changes", err)
		return ctrl.Result{}, nil
	case errors.Is(err, provider.ErrQuotaExceeded):
		msg := fmt.Sprintf("%v; retrying in %s", err, r.QuotaRetry)
		s.log.Info("provider out of capacity; waiting", "op", action, "retryIn", r.QuotaRetry, "error", err.Error())
		st.Phase, st.Message = v1alpha1.PhaseProvisioning, msg
		s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, msg)
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonQuotaExceeded, action, "%s", msg)
		return ctrl.Result{RequeueAfter: r.QuotaRetry}, nil
	case errors.Is(err, provider.ErrTransient) && provider.RetryAfter(err) > 0:
		// The provider says when a retry can succeed (a rate limit's reset): wait that
		// long, at most the error backoff's cap, off the curve.
		wait := min((provider.RetryAfter(err) + time.Second - 1).Truncate(time.Second), maxErrorBackoff)
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonTransientError, action, "%v; retrying in %s", err, wait)
		if provisioning {
			st.Message = err.Error()
			s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonTransientError, err.Error())
		}
		return ctrl.Result{RequeueAfter: wait}, nil
	default:
		// ErrTransient, unclassified errors, and ErrNotFound where the contract rules it out.
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonTransientError, action, "%v; retrying", err)
		if provisioning {
			st.Message = err.Error()
			s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonTransientError, err.Error())
		}
		return ctrl.Result{}, err
	}
}

// progress shows what a long Create is doing on the Provisioned condition, patching at
// most once per ProgressInterval (and at once when the reason changes). Reports only
// record the latest progress; a goroutine of its own writes it, so a provider reporting
// never waits for the API server.
type progress struct {
	r        *ProxyReconciler
	ctx      context.Context
	interval time.Duration
	wake     chan struct{}
	done     chan struct{}

	mu           sync.Mutex
	reason       string
	last         time.Time
	stopped      bool
	pending      *provider.Progress
	pendingEvent bool

	// Owned by the writer goroutine until done is closed.
	px     *v1alpha1.Proxy // private copy, advanced by each patch
	latest *v1alpha1.Proxy // the object after the last successful patch
}

func (r *ProxyReconciler) newProgress(ctx context.Context, s *scope) *progress {
	p := &progress{
		r: r, ctx: ctx, px: s.px.DeepCopy(),
		interval: r.ProgressInterval,
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	go p.run()
	return p
}

// report is installed with provider.WithProgress; providers may call it from any goroutine.
func (p *progress) report(pr provider.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || pr.Reason == "" {
		return
	}
	changed := pr.Reason != p.reason
	if !changed && time.Since(p.last) < p.interval {
		return
	}
	p.reason, p.last = pr.Reason, time.Now()
	p.pending, p.pendingEvent = &pr, p.pendingEvent || changed
	select {
	case p.wake <- struct{}{}:
	default: // a write is already due; it will take this report
	}
}

func (p *progress) run() {
	defer close(p.done)
	for range p.wake {
		p.mu.Lock()
		pr, event := p.pending, p.pendingEvent
		p.pending, p.pendingEvent = nil, false
		p.mu.Unlock()
		if pr != nil {
			p.write(*pr, event)
		}
	}
}

// progressMessage is the sentence a Proxy shows for pr: its message, with the percentage
// when the provider did not state it (kvm2 does).
func progressMessage(pr provider.Progress) string {
	if pr.Total > 0 && !strings.HasSuffix(pr.Message, "%)") {
		return fmt.Sprintf("%s (%d%%)", pr.Message, pr.Done*100/pr.Total)
	}
	return pr.Message
}

func (p *progress) write(pr provider.Progress, event bool) {
	msg := progressMessage(pr)
	s := p.r.newScope(p.ctx, p.px.DeepCopy())
	s.lock = "" // only shows progress: the reconcile's own write decides from what it read
	s.px.Status.Message = msg
	s.setProvisioned(metav1.ConditionFalse, pr.Reason, msg)
	if event {
		s.event(corev1.EventTypeNormal, pr.Reason, common.ActionCreate, "%s", msg)
	}
	if err := p.r.applyStatus(p.ctx, s); err != nil {
		s.log.V(1).Info("progress not shown on the proxy", "reason", pr.Reason, "error", err.Error())
		return
	}
	p.px, p.latest = s.px, s.px
}

// stop ends reporting, drops what was not written yet, waits for a write in flight, and
// returns the object as the last progress write left it (nil when nothing was written).
func (p *progress) stop() *v1alpha1.Proxy {
	p.mu.Lock()
	p.stopped, p.pending = true, nil
	close(p.wake)
	p.mu.Unlock()
	<-p.done
	return p.latest
}

// sourceRanges are spec.proxy.allowedSourceRanges as the provider takes them: a provider
// that manages firewalls admits the proxy port from these networks.
func sourceRanges(px *v1alpha1.Proxy) []string {
	if px.Spec.Proxy == nil || len(px.Spec.Proxy.AllowedSourceRanges) == 0 {
		return nil
	}
	out := make([]string, len(px.Spec.Proxy.AllowedSourceRanges))
	for i, r := range px.Spec.Proxy.AllowedSourceRanges {
		out[i] = string(r)
	}
	return out
}

// poolOf names the ProxyPool that controls px, from its controller reference; zero for a
// standalone Proxy.
func poolOf(px *v1alpha1.Proxy) provider.PoolRef {
	ref, ok := v1alpha1.ControllingPool(px)
	if !ok {
		return provider.PoolRef{}
	}
	return provider.PoolRef{Namespace: px.Namespace, Name: ref.Name, UID: string(ref.UID)}
}
