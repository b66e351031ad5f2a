// Package health is the proxy health engine: it proves that each proxy forwards traffic
// by sending an HTTP GET of a probe URL through it, and records the outcome on the
// Proxy's status (the Healthy condition, latency, egress IP), from which the Proxy
// reconciler moves the phase between Running and Ready.
package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// Defaults of Options.
const (
	DefaultInterval    = 30 * time.Second
	DefaultTimeout     = 10 * time.Second
	DefaultConcurrency = 32
	// DefaultHeartbeatInterval is the longest a probed Proxy's lastProbeTime goes
	// unwritten while nothing else about its health changes.
	DefaultHeartbeatInterval = 10 * time.Minute
	// DefaultBootProbeInterval is how often a Proxy that has just turned Running is
	// probed until its first good probe.
	DefaultBootProbeInterval = time.Second
	// DefaultBootProbeWindow is how long after turning Running a Proxy is probed every
	// BootProbeInterval; then it waits for the rounds like any other.
	DefaultBootProbeWindow = 2 * time.Minute
)

// Options configure an Engine.
type Options struct {
	// NoTargetEvents records no ProbeTargetDown/ProbeTargetUp Events (the log line and
	// the metrics still say it): a manager limited to some namespaces may not create
	// Events in default, where the ProviderHealths' go.
	NoTargetEvents bool
	// ProbeURL is fetched through every proxy (--proxy-probe-url). Pointed at the
	// operator's own /v1/whoami, the answer also yields the proxy's egress IP.
	ProbeURL string
	// Interval between the starts of two rounds (--proxy-check-interval).
	Interval time.Duration
	// Timeout of one probe, connection included.
	Timeout time.Duration
	// Concurrency bounds the probes in flight.
	Concurrency int
	// FailureThreshold is how many consecutive failures take a healthy proxy out of
	// rotation (DefaultFailureThreshold).
	FailureThreshold int32
	// Credentials, when not nil, gives the credentials a probe sends to a Proxy's proxy.
	Credentials proxyconfig.CredentialsFunc
	// HeartbeatInterval: a probe whose outcome changes nothing a user sees (healthy,
	// probe target, egress IP, the Healthy condition, the failure count crossing
	// FailureThreshold) is not written to the status, unless lastProbeTime is at least
	// this old (DefaultHeartbeatInterval). Every probe goes to the metrics.
	HeartbeatInterval time.Duration
	// Informers, when not nil, is where the engine hears of Proxy changes (the
	// manager's cache). A Proxy that turns Running with an address, or gets another
	// instance or address while Running, is probed at once, and again every
	// BootProbeInterval until a probe succeeds or BootProbeWindow has passed, instead of
	// waiting for the next round. Without it only the rounds probe.
	Informers cache.Informers
	// BootProbeInterval is the wait between two probes of a Proxy that has just turned
	// Running and has not answered yet (DefaultBootProbeInterval, --boot-poll-interval).
	BootProbeInterval time.Duration
	// BootProbeWindow bounds those probes (DefaultBootProbeWindow).
	BootProbeWindow time.Duration
	// Hint, when not nil, gives the hint added to the Healthy message of a Proxy that has
	// never answered a probe: its provider's (provider.NeverAnsweredHint), or "".
	Hint func(px *v1alpha1.Proxy) string
	// WireGuard, when not nil, reads the WireGuard Secret a Proxy names
	// (spec.proxy.egress.wireguard): when it states the exit's address (egressIP), a probe
	// whose target saw another one fails with reason EgressMismatch (egress.go).
	WireGuard proxyconfig.WireGuardFunc
	// SkipTargetCheck turns off the direct check of the probe target (target.go): when
	// probes fail and none reached the target, the engine fetches ProbeURL from the
	// manager itself, and if that fails too it holds the target down and counts none of
	// the failures against the proxies (ProbeTargetDown). Turn it off
	// (--probe-target-direct-check=false) where the manager cannot reach the target
	// itself; then every failed probe counts.
	SkipTargetCheck bool
	// TargetCheckTimeout bounds the direct check (DefaultTargetCheckTimeout, at most
	// Timeout).
	TargetCheckTimeout time.Duration
}

// Engine probes every Running or Ready Proxy once per interval. It is a manager
// Runnable that runs only on the leader.
type Engine struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	log       logr.Logger
	opts      Options
	prober    *prober
	now       func() time.Time

	mu sync.Mutex
	// failures holds each probed Proxy's consecutive failed probes, which the status
	// shows only when a write is due anyway, and the health last applied for it.
	failures map[types.UID]probeRecord
	// inflight holds the Proxies being probed right now, by a round or a boot probe:
	// one probe of a Proxy at a time.
	inflight map[types.UID]bool
	// booting holds the Proxies that turned Running and are probed every
	// BootProbeInterval until they answer (boot.go); bootWake tells the boot loop of a
	// new one.
	booting  map[types.NamespacedName]bootEntry
	bootWake chan struct{}
	// reported holds the Proxies with an unreachable report no probe has answered
	// (status.unreachable), by the report's time: the boot loop probes each once, at once.
	reported map[types.NamespacedName]metav1.MicroTime

	// target is what the engine knows of the probe target itself (target.go); direct
	// is the client of its direct check.
	target targetWatch
	direct *http.Client
}

// probeRecord is what the engine keeps of one Proxy's probes through one target: the
// run of failed probes, and the health it last applied.
type probeRecord struct {
	target target
	n      int32
	// written is the engine's part of the status (healthStatusOf) as its last apply for
	// target left it, nil before that apply. The engine is the only writer of these
	// fields, so they are true where the cached copy it decides from may lag behind its
	// own writes: a recovery probe judged against a cached "still healthy" would
	// otherwise see nothing to write and leave the proxy out of rotation until the
	// heartbeat.
	written *v1alpha1.ProxyStatus
}

// New builds an engine. c lists Proxies (from the manager's cache) and applies their
// status; apiReader (may be nil) re-reads a Proxy after a write conflict; rec (may be
// nil) records Events on health transitions.
func New(c client.Client, apiReader client.Reader, rec events.EventRecorder, opts Options, log logr.Logger) (*Engine, error) {
	if opts.ProbeURL == "" {
		return nil, errors.New("health engine: a probe url is required (--proxy-probe-url)")
	}
	p, err := newProber(opts.ProbeURL)
	if err != nil {
		return nil, err
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = min(DefaultTimeout, opts.Interval)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = DefaultFailureThreshold
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.BootProbeInterval <= 0 {
		opts.BootProbeInterval = DefaultBootProbeInterval
	}
	if opts.BootProbeWindow <= 0 {
		opts.BootProbeWindow = DefaultBootProbeWindow
	}
	if opts.TargetCheckTimeout <= 0 {
		opts.TargetCheckTimeout = DefaultTargetCheckTimeout
	}
	opts.TargetCheckTimeout = min(opts.TargetCheckTimeout, opts.Timeout)
	if apiReader == nil {
		apiReader = c
	}
	return &Engine{client: c, apiReader: apiReader, recorder: rec, log: log, opts: opts, prober: p, now: time.Now,
		direct:   newDirectClient(),
		failures: map[types.UID]probeRecord{}, inflight: map[types.UID]bool{},
		booting: map[types.NamespacedName]bootEntry{}, bootWake: make(chan struct{}, 1),
		reported: map[types.NamespacedName]metav1.MicroTime{}}, nil
}

// NeedLeaderElection is true: only one replica writes health to the status.
func (e *Engine) NeedLeaderElection() bool { return true }

// Start runs a round at once and then every interval until ctx ends. A round that
// outlasts the interval delays the next one rather than overlapping it. With
// Options.Informers, Proxies that turn Running are probed at once besides (boot.go).
func (e *Engine) Start(ctx context.Context) error {
	e.log.Info("proxy health engine started", "probeURL", e.opts.ProbeURL, "interval", e.opts.Interval,
		"timeout", e.opts.Timeout, "concurrency", e.opts.Concurrency, "failureThreshold", e.opts.FailureThreshold,
		"heartbeatInterval", e.opts.HeartbeatInterval, "bootProbeInterval", e.opts.BootProbeInterval,
		"bootProbeWindow", e.opts.BootProbeWindow, "probeOnRunning", e.opts.Informers != nil,
		"probeTargetDirectCheck", !e.opts.SkipTargetCheck, "probeTargetCheckTimeout", e.opts.TargetCheckTimeout)
	if down, _ := e.ProbeTargetDown(); !down {
		targetUp.Set(1)
	}
	if e.opts.Informers != nil {
		stop, err := e.watchRunning(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	t := time.NewTicker(e.opts.Interval)
	defer t.Stop()
	for {
		if _, err := e.Round(ctx); err != nil && ctx.Err() == nil {
			e.log.Error(err, "proxy health round failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RoundStats counts what one round did.
type RoundStats struct {
	Probed, Succeeded, Failed, WriteErrors int
	// Writes counts the probe results written to a status (transitions and heartbeats).
	Writes int
	// Conflicts counts status writes refused because the Proxy changed after it was read
	// (then read again, and the result dropped or laid onto the fresh copy).
	Conflicts int
	// TargetDown: the probe target itself did not answer (ProbeTargetDown), so the
	// round's Uncounted failed probes were not counted against their proxies.
	TargetDown bool
	Uncounted  int
}

// heldProbe is a failed probe of a round, kept until the round has judged the probe
// target; the Proxy stays claimed meanwhile.
type heldProbe struct {
	px *v1alpha1.Proxy
	r  result
}

// Round probes every eligible Proxy once and records the results. A success is
// recorded at once; a failure waits for the end of the round: when no probe of the
// round reached the probe target and the manager cannot reach it directly either, the
// target is down and no failure of the round is counted (target.go).
func (e *Engine) Round(ctx context.Context) (RoundStats, error) {
	start := e.now()
	var list v1alpha1.ProxyList
	if err := e.client.List(ctx, &list); err != nil {
		return RoundStats{}, fmt.Errorf("listing proxies: %w", err)
	}
	var (
		wg                     sync.WaitGroup
		sem                    = make(chan struct{}, e.opts.Concurrency)
		probed, ok, bad, wfail atomic.Int64
		conflicts, writes      atomic.Int64
		reached                atomic.Bool
		probing                = make(map[types.UID]bool, len(list.Items))
		heldMu                 sync.Mutex
		held                   []heldProbe
	)
	recordOne := func(px *v1alpha1.Proxy, r result) {
		n, wrote, err := e.record(ctx, px, r)
		conflicts.Add(int64(n))
		if wrote {
			writes.Add(1)
		}
		if err != nil {
			wfail.Add(1)
			e.log.Error(err, "recording probe result", "proxy", client.ObjectKeyFromObject(px))
		}
	}
	releaseHeld := func() {
		for _, h := range held {
			e.release(h.px.UID)
		}
	}
	for i := range list.Items {
		px := &list.Items[i]
		if !eligible(px) {
			e.retire(ctx, px)
			continue
		}
		probing[px.UID] = true
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			releaseHeld()
			return RoundStats{}, ctx.Err()
		}
		// When a boot probe of it is in flight, its result stands for this round.
		e.goProbeKeep(&wg, sem, px.UID, func() bool {
			r := e.probeOne(ctx, px)
			if ctx.Err() != nil {
				return false // shutting down or lost the lease: not the proxy's failure
			}
			probed.Add(1)
			if r.err == nil {
				ok.Add(1)
			} else {
				bad.Add(1)
			}
			if reachedTarget(r) {
				reached.Store(true)
				e.noteReached(r)
			} else if !e.opts.SkipTargetCheck {
				heldMu.Lock()
				held = append(held, heldProbe{px, r})
				heldMu.Unlock()
				return true // claimed until recorded or dropped
			}
			recordOne(px, r)
			return false
		})
	}
	wg.Wait()
	e.forget(probing)
	stats := RoundStats{Probed: int(probed.Load()), Succeeded: int(ok.Load()), Failed: int(bad.Load())}
	if ctx.Err() != nil {
		releaseHeld()
		return stats, ctx.Err()
	}
	var down error
	if len(held) > 0 && !reached.Load() {
		down = e.targetAnswers(ctx, start)
	}
	if ctx.Err() != nil {
		releaseHeld()
		return stats, ctx.Err()
	}
	if down != nil {
		stats.TargetDown, stats.Uncounted = true, len(held)
		uncountedRounds.Inc()
		releaseHeld()
	} else {
		for _, h := range held {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { e.release(h.px.UID); <-sem; wg.Done() }()
				recordOne(h.px, h.r)
			}()
		}
		wg.Wait()
	}
	if stats.Probed > 0 {
		e.judgeTarget(ctx, start, down, stats.Failed)
	}
	stats.WriteErrors, stats.Conflicts, stats.Writes = int(wfail.Load()), int(conflicts.Load()), int(writes.Load())
	return stats, ctx.Err()
}

// goProbe runs probe in a goroutine of wg that holds a slot of sem (taken by the
// caller) and the claim on uid, and gives both back when probe returns. When uid is
// being probed already it runs nothing, gives the slot back and returns false.
func (e *Engine) goProbe(wg *sync.WaitGroup, sem chan struct{}, uid types.UID, probe func()) bool {
	return e.goProbeKeep(wg, sem, uid, func() bool { probe(); return false })
}

// goProbeKeep is goProbe whose probe may keep the claim on uid by returning true: the
// slot goes back, the claim stays until the caller releases it.
func (e *Engine) goProbeKeep(wg *sync.WaitGroup, sem chan struct{}, uid types.UID, probe func() (keep bool)) bool {
	if !e.claim(uid) {
		<-sem
		return false
	}
	wg.Add(1)
	go func() {
		keep := false
		defer func() {
			if !keep {
				e.release(uid)
			}
			<-sem
			wg.Done()
		}()
		keep = probe()
	}()
	return true
}

// claim marks uid as being probed; false when it already is.
func (e *Engine) claim(uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inflight[uid] {
		return false
	}
	e.inflight[uid] = true
	return true
}

func (e *Engine) release(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.inflight, uid)
}

// forget drops the failure runs of Proxies this round did not probe: gone, or out of
// Running/Ready, they start again from their status when probed again.
func (e *Engine) forget(probing map[types.UID]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid := range e.failures {
		if !probing[uid] {
			delete(e.failures, uid)
		}
	}
}

// failuresOf is the run of failed probes through px's current target: the engine's own
// count, or the status's when the engine has none (a new leader, a new instance).
func (e *Engine) failuresOf(px *v1alpha1.Proxy) int32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f, ok := e.failures[px.UID]; ok && f.target == probeTarget(px) {
		return f.n
	}
	return px.Status.ConsecutiveProbeFailures
}

func (e *Engine) setFailures(px *v1alpha1.Proxy, n int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := probeRecord{target: probeTarget(px), n: n}
	if old, ok := e.failures[px.UID]; ok && old.target == f.target {
		f.written = old.written
	}
	e.failures[px.UID] = f
}

// setWritten remembers own as what the engine's apply left in px's status.
func (e *Engine) setWritten(px *v1alpha1.Proxy, own *v1alpha1.ProxyStatus) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.failures[px.UID]
	if f.target != probeTarget(px) {
		f = probeRecord{target: probeTarget(px), n: own.ConsecutiveProbeFailures}
	}
	f.written = own
	e.failures[px.UID] = f
}

// layWritten lays the health the engine last applied for px's current target onto
// px's status, where a copy from the cache may not show it yet.
func (e *Engine) layWritten(px *v1alpha1.Proxy) {
	e.mu.Lock()
	f, ok := e.failures[px.UID]
	e.mu.Unlock()
	if !ok || f.written == nil || f.target != probeTarget(px) {
		return
	}
	own, st := f.written, &px.Status
	st.Healthy, st.ProbeTarget, st.LastProbeTime = own.Healthy, own.ProbeTarget, own.LastProbeTime.DeepCopy()
	st.ProbeLatencyMilliseconds, st.EgressIP = own.ProbeLatencyMilliseconds, own.EgressIP
	st.ConsecutiveProbeFailures = own.ConsecutiveProbeFailures
	st.UnreachableProbe = own.UnreachableProbe.DeepCopy()
	meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionHealthy)
	for _, c := range own.Conditions {
		st.Conditions = append(st.Conditions, *c.DeepCopy())
	}
}

// eligible: the health engine looks only at proxies whose instance runs and has an
// address (Managed ones the reconciler moved to Running, External ones it published).
func eligible(px *v1alpha1.Proxy) bool {
	return px.DeletionTimestamp == nil && px.Status.IP != "" &&
		(px.Status.Phase == v1alpha1.PhaseRunning || px.Status.Phase == v1alpha1.PhaseReady)
}

// retire clears the health of a Proxy that left Running/Ready while healthy (the
// reconciler is replacing its instance, or it failed), so that kubectl does not show a
// proxy that is not running as healthy. It writes once per such change; its apply holds
// only the engine's fields, so it never conflicts with the reconciler's.
func (e *Engine) retire(ctx context.Context, px *v1alpha1.Proxy) {
	e.layWritten(px)
	if !px.Status.Healthy || px.DeletionTimestamp != nil || px.Status.Phase == v1alpha1.PhaseDeleting {
		return
	}
	base := px.DeepCopy()
	px.Status.Healthy = false
	px.Status.ConsecutiveProbeFailures = 0
	setHealthy(px, metav1.ConditionFalse, ReasonNotProbed,
		fmt.Sprintf("not probed while the proxy is %s; probing resumes when it runs again", px.Status.Phase))
	err := statusapply.Status(ctx, e.client, px, healthStatusOf(&px.Status), statusapply.ProxyHealth,
		statusapply.Claiming(healthStatusOf(&base.Status)))
	if err != nil && !apierrors.IsNotFound(err) {
		e.log.Error(err, "clearing the health of a proxy that is not running", "proxy", client.ObjectKeyFromObject(px))
	}
}

func proxyURL(px *v1alpha1.Proxy) *url.URL {
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(px.Status.IP, strconv.Itoa(int(px.Port())))}
}

func (e *Engine) probeOne(ctx context.Context, px *v1alpha1.Proxy) result {
	creds, err := e.credentials(ctx, px)
	var want netip.Addr
	if err == nil {
		want, err = e.expectedEgress(ctx, px)
	}
	r := result{err: err}
	if err == nil {
		u := proxyURL(px)
		r = verifyEgress(e.prober.probe(ctx, u, creds, e.opts.Timeout), want, u.Host)
	}
	if ctx.Err() != nil {
		return r
	}
	outcome := "success"
	if r.err != nil {
		outcome = "failure"
	}
	prov := providerLabel(px)
	probesTotal.WithLabelValues(outcome, prov).Inc()
	probeDuration.WithLabelValues(prov).Observe(r.latency.Seconds())
	e.log.V(1).Info("proxy probed", "proxy", client.ObjectKeyFromObject(px), "result", outcome,
		"latency", r.latency, "egressIP", r.egressIP, "error", r.err)
	return r
}

// record lays r onto the Proxy's status and applies the engine's part of it when
// something a user sees changed, or the heartbeat of lastProbeTime is due (writeReason);
// otherwise only the engine's failure count advances. The apply carries the version the
// Proxy was read at (statusapply.IfVersion), so a result never lands on a Proxy that
// changed unseen: on a conflict the Proxy is read again, and if the reconciler has
// meanwhile moved it out of Running/Ready or given it another instance or address than
// the one probed, the result is dropped (a probe of the old VM says nothing of the new
// one); otherwise it is laid onto the fresh copy. It returns the number of conflicts met
// and whether the result was written.
//
// px is the Proxy as read before the probe: a crawler's unreachable report it shows
// open (status.unreachable) is answered by r (answerUnreachable); one that came later
// is not, and waits for another probe.
func (e *Engine) record(ctx context.Context, px *v1alpha1.Proxy, r result) (int, bool, error) {
	now := e.now()
	key := client.ObjectKeyFromObject(px)
	probed := probeTarget(px)
	var mark *v1alpha1.ProxyUnreachable
	if bans.UnreachableOpen(&px.Status) {
		mark = px.Status.Unreachable.DeepCopy()
	}
	attempts, wrote := 0, false
	// The count this result advances, so that a write refused for a conflict and tried
	// again on a fresh copy advances it once, not once per attempt.
	failures := e.failuresOf(px)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if attempts++; attempts > 1 {
			fresh := &v1alpha1.Proxy{}
			if err := e.apiReader.Get(ctx, key, fresh); err != nil {
				return err
			}
			if !eligible(fresh) || probeTarget(fresh) != probed {
				return nil
			}
			px = fresh
			e.setFailures(px, failures)
		}
		var err error
		wrote, err = e.write(ctx, px, r, now, mark)
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return attempts - 1, false, nil
	case err != nil:
		return attempts - 1, false, fmt.Errorf("applying health status of proxy %s: %w", key, err)
	}
	return attempts - 1, wrote, nil
}

// write lays r onto px and applies the result if writeReason says so, under the
// proxy-health field manager and px's version. mark, when not nil, is the unreachable
// report r answers: a failure then takes the proxy out at once, whatever the threshold
// (the crawler's report was the first failure), and status.unreachableProbe records the
// answer.
func (e *Engine) write(ctx context.Context, px *v1alpha1.Proxy, r result, now time.Time, mark *v1alpha1.ProxyUnreachable) (bool, error) {
	e.layWritten(px)
	base := px.DeepCopy()
	px.Status.ConsecutiveProbeFailures = e.failuresOf(px)
	hint := ""
	if e.opts.Hint != nil {
		hint = e.opts.Hint(px)
	}
	threshold := e.opts.FailureThreshold
	if mark != nil {
		threshold = 1
		px.Status.UnreachableProbe = &v1alpha1.ProxyUnreachableProbe{ReportedAt: mark.ReportedAt,
			ProbedAt: metav1.NewTime(now), Passed: r.err == nil}
	}
	tr := layResult(px, r, now, threshold, hint)
	if mark != nil && tr != nil && r.err != nil {
		tr.note = fmt.Sprintf("proxy is unhealthy: a crawler reported it unreachable and a probe confirmed it; last: %v", r.err)
	}
	e.setFailures(px, px.Status.ConsecutiveProbeFailures)
	why := writeReason(&base.Status, &px.Status, now, e.opts.FailureThreshold, e.opts.HeartbeatInterval)
	if why == "" {
		return false, nil
	}
	own := healthStatusOf(&px.Status)
	if err := statusapply.Status(ctx, e.client, px, own, statusapply.ProxyHealth,
		statusapply.IfVersion(base.ResourceVersion), statusapply.Claiming(healthStatusOf(&base.Status))); err != nil {
		return false, err
	}
	e.setWritten(px, own)
	statusWrites.WithLabelValues(why).Inc()
	if mark != nil {
		answer := "passed"
		if r.err != nil {
			answer = "failed"
		}
		unreachableProbes.WithLabelValues(answer).Inc()
	}
	if tr != nil && e.recorder != nil {
		e.recorder.Eventf(px, nil, tr.typ, tr.reason, "Probe", "%s", tr.note)
	}
	return true, nil
}

// Why a probe result is written (the status_writes metric's label).
const (
	writeTransition = "transition"
	writeHeartbeat  = "heartbeat"
	// writeUnreachable: the probe answered a crawler's unreachable report
	// (status.unreachableProbe), and nothing else a user sees changed.
	writeUnreachable = "unreachable"
)

// writeReason says whether the probe result that turned old into cur must be written:
// a transition when a field a user sees changed (healthy, egress IP, the Healthy
// condition, the probe target, the failure count crossing threshold), a heartbeat when old's
// lastProbeTime is heartbeat old or missing, "" otherwise. Latency, lastProbeTime and a
// failure count below or past the threshold alone are no reason.
func writeReason(old, cur *v1alpha1.ProxyStatus, now time.Time, threshold int32, heartbeat time.Duration) string {
	oc := meta.FindStatusCondition(old.Conditions, v1alpha1.ConditionHealthy)
	nc := meta.FindStatusCondition(cur.Conditions, v1alpha1.ConditionHealthy)
	condChanged := (oc == nil) != (nc == nil) ||
		(oc != nil && (oc.Status != nc.Status || oc.Reason != nc.Reason || oc.Message != nc.Message))
	if old.Healthy != cur.Healthy || old.ProbeTarget != cur.ProbeTarget || old.EgressIP != cur.EgressIP || condChanged ||
		(old.ConsecutiveProbeFailures >= threshold) != (cur.ConsecutiveProbeFailures >= threshold) {
		return writeTransition
	}
	if !equality.Semantic.DeepEqual(old.UnreachableProbe, cur.UnreachableProbe) {
		return writeUnreachable
	}
	if old.LastProbeTime == nil || now.Sub(old.LastProbeTime.Time) >= heartbeat {
		return writeHeartbeat
	}
	return ""
}

// providerLabel is the provider a Proxy's probes are counted under: spec.provider, or
// "external" for an External proxy.
func providerLabel(px *v1alpha1.Proxy) string {
	if px.Spec.Mode == v1alpha1.ProxyModeExternal || px.Spec.Provider == "" {
		return "external"
	}
	return px.Spec.Provider
}

// target is what one probe went through: the instance and the address it was reached at.
type target struct {
	providerID, url string
}

func probeTarget(px *v1alpha1.Proxy) target {
	return target{providerID: px.Status.ProviderID, url: proxyURL(px).String()}
}
