package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// DefaultTargetCheckTimeout bounds the direct check of the probe target (capped at the
// probe timeout).
const DefaultTargetCheckTimeout = 5 * time.Second

// Reasons of the Events recorded on every ProviderHealth when the probe target stops and
// starts answering.
const (
	ReasonProbeTargetDown = "ProbeTargetDown"
	ReasonProbeTargetUp   = "ProbeTargetUp"
)

// targetWatch is what the engine knows of the probe target itself, apart from the
// proxies: whether it holds it down (and since when), the last direct check, and the
// last time a probe through a proxy reached it.
type targetWatch struct {
	// checkMu lets one direct check run at a time; the others wait for its result.
	checkMu sync.Mutex

	mu        sync.Mutex
	down      bool
	since     time.Time
	upSince   time.Time // the end of the last outage; zero before any
	judged    time.Time // the start of the round whose verdict holds
	checkedAt time.Time // zero: never checked
	checkErr  error     // the last direct check's error, nil when it passed
	reached   time.Time // the last probe through a proxy that got the target's answer
}

// ProbeTargetWatch is what the health engine tells of the probe target itself, for
// whatever acts on failed probes (remediation): *Engine implements it. While down, do
// not act on failed probes; start a fault's clock no earlier than ProbeTargetUpSince.
type ProbeTargetWatch interface {
	ProbeTargetDown() (down bool, since time.Time)
	ProbeTargetUpSince() time.Time
}

var _ ProbeTargetWatch = (*Engine)(nil)

// ProbeTargetDown says whether the engine holds the probe target itself down, and since
// when: the last round's probes failed, none reached the target through any proxy, and
// the manager could not reach it directly either (Options.SkipTargetCheck off). While it
// is down the engine counts no failed probe against the proxies, so their health stays
// as it was. Safe for concurrent use.
//
// Remediation (rebooting or replacing VMs that fail their probes) must treat down as
// "do not remediate": the proxies' failures say nothing about the proxies then, and an
// outage of the probe target must never replace a VM. It is false before the first
// round, on a replica that is not the leader, and always with Options.SkipTargetCheck.
func (e *Engine) ProbeTargetDown() (down bool, since time.Time) {
	e.target.mu.Lock()
	defer e.target.mu.Unlock()
	return e.target.down, e.target.since
}

// noteReached notes when a probe through a proxy got the target's answer (a success,
// or an answer from the wrong egress address).
func (e *Engine) noteReached(r result) {
	if !reachedTarget(r) {
		return
	}
	now := e.now()
	e.target.mu.Lock()
	defer e.target.mu.Unlock()
	if now.After(e.target.reached) {
		e.target.reached = now
	}
}

// ProbeTargetUpSince is when the engine last found the probe target answering again after
// an outage (ProbeTargetDown), zero when it has not held it down since it started. A
// proxy's fault clock (boot or unhealthy timeout) should start no earlier: failures
// before it were not counted. Safe for concurrent use.
func (e *Engine) ProbeTargetUpSince() time.Time {
	e.target.mu.Lock()
	defer e.target.mu.Unlock()
	return e.target.upSince
}

// reachedTarget says whether r got the target's answer: a success, or an answer that
// came from the wrong egress address.
func reachedTarget(r result) bool {
	return r.err == nil || r.reason == v1alpha1.ReasonEgressMismatch
}

// checkTarget fetches the probe URL from the manager itself, without a proxy (the
// manager's own HTTP_PROXY/HTTPS_PROXY/NO_PROXY environment applies), within
// TargetCheckTimeout; a 2xx or 3xx answer passes, as for a probe. A check made at
// notBefore or later is reused instead of a new one. It returns the check's error, nil
// when the target answered.
func (e *Engine) checkTarget(ctx context.Context, notBefore time.Time) error {
	e.target.checkMu.Lock()
	defer e.target.checkMu.Unlock()
	e.target.mu.Lock()
	at, err := e.target.checkedAt, e.target.checkErr
	e.target.mu.Unlock()
	if !at.IsZero() && !at.Before(notBefore) {
		return err
	}
	err = e.fetchDirect(ctx)
	if ctx.Err() != nil {
		return err // shutting down: nothing learnt
	}
	result := "up"
	if err != nil {
		result = "down"
	}
	targetChecks.WithLabelValues(result).Inc()
	e.target.mu.Lock()
	e.target.checkedAt, e.target.checkErr = e.now(), err
	e.target.mu.Unlock()
	return err
}

func (e *Engine) fetchDirect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.TargetCheckTimeout)
	defer cancel()
	target := e.prober.target
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return fmt.Errorf("building the direct request of %s: %w", target, err)
	}
	req.Header.Set("Accept", "application/json, text/plain;q=0.9")
	req.Header.Set("User-Agent", "egress-proxies-operator-health")
	res, err := e.direct.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%s directly from the manager: %w", target, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxProbeBody))
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 399 {
		return fmt.Errorf("%s directly from the manager: answered %s", target, res.Status)
	}
	return nil
}

// newDirectClient is the client of the direct check: no operator proxy, a fresh
// connection each time, a redirect taken as an answer.
func newDirectClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true,
			MaxResponseHeaderBytes: 16 << 10},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// targetAnswers judges the probe target after probes failed: it answers when a probe
// through a proxy reached it at notBefore or later, or when the direct check (made at
// notBefore or later, or now) passes. With Options.SkipTargetCheck it always answers.
// It returns nil when the target answers, else the direct check's error.
func (e *Engine) targetAnswers(ctx context.Context, notBefore time.Time) error {
	if e.opts.SkipTargetCheck {
		return nil
	}
	e.target.mu.Lock()
	reached := !e.target.reached.Before(notBefore)
	e.target.mu.Unlock()
	if reached {
		return nil
	}
	return e.checkTarget(ctx, notBefore)
}

// targetFreshness is how old a probe that reached the target, or a direct check, may be
// to judge a failed probe outside the rounds (at most the interval).
const targetFreshness = 10 * time.Second

// uncounted says whether a failed probe outside the rounds (a booting Proxy's, one
// answering a crawler's report) is left uncounted because the target is down: the last
// round found it down, or it answers neither through a proxy nor directly now (a probe
// that reached it, or a direct check, of the last 10 seconds stands for now).
func (e *Engine) uncounted(ctx context.Context, r result) bool {
	if reachedTarget(r) || e.opts.SkipTargetCheck {
		return false
	}
	if down, _ := e.ProbeTargetDown(); down {
		return true
	}
	return e.targetAnswers(ctx, e.now().Add(-min(targetFreshness, e.opts.Interval))) != nil
}

// judgeTarget takes the verdict of a round that started at start and probed: up (err
// nil) or down (err is why), and reports a change: a log line, the gauge, and an Event
// on every ProviderHealth. The verdict of a round that started before the one whose
// verdict holds is dropped.
func (e *Engine) judgeTarget(ctx context.Context, start time.Time, err error, failed int) {
	now := e.now()
	e.target.mu.Lock()
	if start.Before(e.target.judged) {
		e.target.mu.Unlock()
		return
	}
	e.target.judged = start
	was, since := e.target.down, e.target.since
	e.target.down = err != nil
	if err != nil && !was {
		e.target.since = now
	}
	if err == nil {
		e.target.since = time.Time{}
		if was {
			e.target.upSince = now
		}
	}
	e.target.mu.Unlock()
	if err != nil {
		targetUp.Set(0)
	} else {
		targetUp.Set(1)
	}
	switch {
	case err != nil && !was:
		e.log.Info("probe target down: it answers neither through any proxy nor directly from the manager; failed probes are not counted against the proxies until it answers again",
			"probeURL", e.opts.ProbeURL, "failedProbes", failed, "error", err.Error())
		e.targetEvent(ctx, corev1.EventTypeWarning, ReasonProbeTargetDown, fmt.Sprintf(
			"the probe target %s answers neither through any proxy (%d probes failed) nor directly from the manager (%v): failed probes are not counted against the proxies until it answers again; do not remediate proxies meanwhile",
			e.opts.ProbeURL, failed, err))
	case err == nil && was:
		e.log.Info("probe target up again: failed probes count against the proxies again",
			"probeURL", e.opts.ProbeURL, "downFor", now.Sub(since).Round(time.Second).String())
		e.targetEvent(ctx, corev1.EventTypeNormal, ReasonProbeTargetUp, fmt.Sprintf(
			"the probe target %s answers again after %s down: failed probes count against the proxies again",
			e.opts.ProbeURL, now.Sub(since).Round(time.Second)))
	}
}

// targetEvent records an Event on every ProviderHealth: the cluster-scoped objects that
// stand for the places proxies run. Without a recorder, or without any ProviderHealth
// (no providers configured), the log line and the metrics say it alone.
func (e *Engine) targetEvent(ctx context.Context, typ, reason, note string) {
	if e.recorder == nil || e.opts.NoTargetEvents {
		return
	}
	var list v1alpha1.ProviderHealthList
	if err := e.apiReader.List(ctx, &list); err != nil {
		e.log.Error(err, "listing the providerhealths to record the probe target's event on", "reason", reason)
		return
	}
	for i := range list.Items {
		e.recorder.Eventf(&list.Items[i], nil, typ, reason, "ProbeTarget", "%s", note)
	}
}

// targetIsDown: a probe outside the rounds (boot.go) failed while the probe target is
// down (uncounted), so it is not recorded. A probe that reached the target is noted.
func (e *Engine) targetIsDown(ctx context.Context, px *v1alpha1.Proxy, r result) bool {
	if reachedTarget(r) {
		e.noteReached(r)
		return false
	}
	if !e.uncounted(ctx, r) {
		return false
	}
	e.log.V(1).Info("failed probe not counted: the probe target is down", "proxy", client.ObjectKeyFromObject(px), "error", r.err)
	return true
}
