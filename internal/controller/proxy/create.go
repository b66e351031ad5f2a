package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	if err := r.syncSnapshot(ctx, s, creds); err != nil {
		if errors.Is(err, errSnapshotTaken) {
			v := judgeSnapshotTaken(s.px, err, r.timings())
			s.enact(v)
			return v.result, nil
		}
		return r.providerError(s, common.ActionCreate, err, true)
	}
	return r.provision(ctx, s, p, want.rendered, userData, &want)
}

// restart asks the provider to start the Proxy's stopped instance as it was built: the
// request carries the rendered hash the instance is marked with, so the provider adopts
// it rather than building it again; hashes and snapshot stay as they are.
func (r *ProxyReconciler) restart(ctx context.Context, s *scope, p provider.Provider, userData []byte) (ctrl.Result, error) {
	return r.provision(ctx, s, p, s.px.Status.RenderedHash, userData, nil)
}

// provision runs the provider's Create for the Proxy with specHash as the instance's
// mark, and carries out the verdict on its answer (judgeCreated); want are the hashes a
// new instance is built from, nil for a restart.
func (r *ProxyReconciler) provision(ctx context.Context, s *scope, p provider.Provider, specHash string, userData []byte, want *hashes) (ctrl.Result, error) {
	px := s.px
	name := px.InstanceName()
	v, announce := judgeProvision(px, s.base.Status.Phase)
	s.enact(v)
	if announce {
		// A Create may take minutes (a first image download): show Provisioning meanwhile.
		if err := r.applyStatus(ctx, s); err != nil {
			return ctrl.Result{}, err
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
	c := created{inst: inst, err: err, want: want}
	if err == nil {
		c.hold = r.holdFacts(px.UID)
	}
	v = judgeCreated(px, c, r.timings())
	s.enact(v)
	return v.result, v.err
}

// providerError carries out the verdict on a provider error (judgeProviderError) and
// returns what the reconcile returns.
func (r *ProxyReconciler) providerError(s *scope, action string, err error, provisioning bool) (ctrl.Result, error) {
	v := judgeProviderError(s.px, action, err, provisioning, r.timings())
	s.enact(v)
	return v.result, v.err
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
