package providerhealth

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// Defaults of the provider health monitor.
const (
	DefaultProviderCheckInterval = time.Minute
	DefaultProviderCheckTimeout  = 15 * time.Second
)

var providerTargetUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "proxy_operator_provider_target_up",
	Help: "1 when the last health check of the provider's target succeeded, 0 otherwise.",
}, []string{"provider", "target"})

func init() { metrics.Registry.MustRegister(providerTargetUp) }

// ProviderHealthMonitor checks every provider's targets every Interval and publishes the
// results in the ProviderHealth object named after the provider and in the
// proxy_operator_provider_target_up gauge. It runs on the leader only.
type ProviderHealthMonitor struct {
	Client client.Client
	// APIReader reads the ProviderHealth before it is written, so a lagging cache never
	// causes a conflict, and lists them once at start (the manager's API reader; Client
	// when nil). One read per provider per interval.
	APIReader client.Reader
	Providers map[string]provider.Provider
	// Interval between rounds (DefaultProviderCheckInterval).
	Interval time.Duration
	// Timeout bounds one provider's Check (DefaultProviderCheckTimeout).
	Timeout time.Duration
	Log     logr.Logger
	// TracerProvider opens the providerhealth.check spans (otel's global one when nil).
	TracerProvider trace.TracerProvider
	// Remediation, when set, gives the RemediationAllowed condition of a provider's
	// standalone Proxies (ProxyReconciler.ProviderRemediation), published with each
	// round's status. An error keeps the condition the object has.
	Remediation func(ctx context.Context, provider string, now time.Time) (metav1.Condition, error)
	// Clock is the time the status and the conditions carry (the real clock when nil).
	Clock clock.PassiveClock

	mu      sync.Mutex
	targets map[string][]string // per provider, the targets the gauge has series for
	// defaults fills the unset fields once (setDefaults).
	defaults sync.Once
}

// NeedLeaderElection is true: one replica writes ProviderHealth.
func (m *ProviderHealthMonitor) NeedLeaderElection() bool { return true }

// Start removes the ProviderHealth objects of providers no longer configured (see
// RemoveUnconfigured), then checks at once and every Interval until ctx ends.
func (m *ProviderHealthMonitor) Start(ctx context.Context) error {
	m.setDefaults()
	t := time.NewTicker(m.Interval)
	defer t.Stop()
	removed := false
	for {
		if !removed {
			err := m.RemoveUnconfigured(ctx)
			removed = err == nil
			if err != nil && ctx.Err() == nil {
				m.Log.Error(err, "removing providerhealth objects of providers no longer configured; trying again next round")
			}
		}
		m.CheckAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CheckAll checks every provider concurrently and publishes the results; a provider
// whose status cannot be written is logged and does not hold up the others.
func (m *ProviderHealthMonitor) CheckAll(ctx context.Context) {
	m.setDefaults()
	names := make([]string, 0, len(m.Providers))
	for n := range m.Providers {
		names = append(names, n)
	}
	sort.Strings(names)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.checkOne(ctx, name, m.Providers[name]); err != nil && ctx.Err() == nil {
				m.Log.Error(err, "publishing provider health", "provider", name)
			}
		}()
	}
	wg.Wait()
}

func (m *ProviderHealthMonitor) checkOne(ctx context.Context, name string, p provider.Provider) error {
	tp := m.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	ctx, span := tp.Tracer("egress-proxies-operator/controller").Start(ctx, "providerhealth.check",
		trace.WithAttributes(attribute.String("provider", name)))
	defer span.End()
	cctx, cancel := context.WithTimeout(ctx, m.Timeout)
	statuses := p.Check(cctx)
	cancel()
	if ctx.Err() != nil {
		return nil // shutting down or lost the lease: the targets did not fail
	}
	now := m.Clock.Now()

	st := statusFor(statuses, now)
	span.SetAttributes(attribute.Int("providerhealth.ready", int(st.ReadyTargets)),
		attribute.Int("providerhealth.total", int(st.TotalTargets)))
	if st.ReadyTargets < st.TotalTargets {
		span.SetStatus(codes.Error, st.Ready+" targets ready")
	}
	m.updateGauge(name, statuses)
	m.Log.V(1).Info("provider checked", "provider", name, "ready", st.Ready)
	var brake *metav1.Condition
	if m.Remediation != nil {
		c, err := m.Remediation(ctx, name, now)
		if err != nil {
			m.Log.Error(err, "working out whether remediation is allowed; the RemediationAllowed condition is kept as it is", "provider", name)
		} else {
			brake = &c
		}
	}
	if err := m.publish(ctx, name, st, brake); err != nil {
		span.RecordError(err)
		return err
	}
	return nil
}

// RemoveUnconfigured deletes every ProviderHealth whose name is not a configured
// provider: what is left of a provider taken out of the providers config. The config is
// read once per process, so Start does this once, when it begins (on winning the lease),
// and again on each round only until it has succeeded once.
func (m *ProviderHealthMonitor) RemoveUnconfigured(ctx context.Context) error {
	m.setDefaults()
	var list v1alpha1.ProviderHealthList
	if err := m.APIReader.List(ctx, &list); err != nil {
		return fmt.Errorf("listing providerhealth objects: %w", err)
	}
	var errs []error
	for i := range list.Items {
		ph := &list.Items[i]
		if _, ok := m.Providers[ph.Name]; ok {
			continue
		}
		// The UID precondition spares an object recreated under the same name meanwhile.
		err := m.Client.Delete(ctx, ph, client.Preconditions{UID: &ph.UID})
		if client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting providerhealth %s: %w", ph.Name, err))
			continue
		}
		m.Log.Info("removed the providerhealth of a provider no longer configured", "provider", ph.Name)
	}
	return errors.Join(errs...)
}

// setDefaults fills, once, what was left unset: Interval and Timeout (their defaults),
// APIReader (Client) and Clock (the real one). Start, CheckAll and RemoveUnconfigured
// call it.
func (m *ProviderHealthMonitor) setDefaults() {
	m.defaults.Do(func() {
		if m.Interval <= 0 {
			m.Interval = DefaultProviderCheckInterval
		}
		if m.Timeout <= 0 {
			m.Timeout = DefaultProviderCheckTimeout
		}
		if m.APIReader == nil {
			m.APIReader = m.Client
		}
		if m.Clock == nil {
			m.Clock = clock.RealClock{}
		}
	})
}

// statusFor turns the provider's statuses, in the order returned (config order), into
// the ProviderHealth status.
func statusFor(statuses []provider.TargetStatus, now time.Time) v1alpha1.ProviderHealthStatus {
	t := metav1.NewTime(now)
	st := v1alpha1.ProviderHealthStatus{LastChecked: &t, TotalTargets: int32(len(statuses)),
		Targets: make([]v1alpha1.ProviderTargetStatus, 0, len(statuses))}
	for _, s := range statuses {
		if s.Ready {
			st.ReadyTargets++
		}
		st.Targets = append(st.Targets, v1alpha1.ProviderTargetStatus{
			Name: s.Target, Ready: s.Ready, Reason: s.Reason, Message: s.Message,
			Latency: metav1.Duration{Duration: s.Latency}, LastChecked: t, Details: s.Details,
		})
	}
	st.Ready = strconv.Itoa(int(st.ReadyTargets)) + "/" + strconv.Itoa(int(st.TotalTargets))
	return st
}

// publish writes st to the ProviderHealth named name, creating the object if missing.
// The monitor applies the whole status as the providerhealth field manager, its only
// writer. The object's conditions are kept, with brake (when not nil) set among them:
// its last transition time moves only when its status does.
func (m *ProviderHealthMonitor) publish(ctx context.Context, name string, st v1alpha1.ProviderHealthStatus, brake *metav1.Condition) error {
	reader := m.APIReader
	ph := &v1alpha1.ProviderHealth{}
	err := reader.Get(ctx, client.ObjectKey{Name: name}, ph)
	if apierrors.IsNotFound(err) {
		ph = &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
		err = m.Client.Create(ctx, ph)
		if apierrors.IsAlreadyExists(err) {
			err = reader.Get(ctx, client.ObjectKey{Name: name}, ph)
		}
	}
	if err != nil {
		return fmt.Errorf("getting or creating providerhealth %s: %w", name, err)
	}
	for _, c := range ph.Status.Conditions {
		st.Conditions = append(st.Conditions, *c.DeepCopy())
	}
	if brake != nil {
		brake.ObservedGeneration = ph.Generation
		if st.LastChecked != nil {
			brake.LastTransitionTime = *st.LastChecked // the round's time, should it transition
		}
		meta.SetStatusCondition(&st.Conditions, *brake)
	}
	if err := statusapply.Status(ctx, m.Client, ph, &st, statusapply.ProviderHealth); err != nil {
		return fmt.Errorf("applying status of providerhealth %s: %w", name, err)
	}
	return nil
}

// updateGauge sets one series per target and removes the series of targets the
// provider no longer reports.
func (m *ProviderHealthMonitor) updateGauge(name string, statuses []provider.TargetStatus) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.targets == nil {
		m.targets = map[string][]string{}
	}
	now := make([]string, 0, len(statuses))
	seen := map[string]bool{}
	for _, s := range statuses {
		v := 0.0
		if s.Ready {
			v = 1
		}
		providerTargetUp.WithLabelValues(name, s.Target).Set(v)
		now = append(now, s.Target)
		seen[s.Target] = true
	}
	for _, old := range m.targets[name] {
		if !seen[old] {
			providerTargetUp.DeleteLabelValues(name, old)
		}
	}
	m.targets[name] = now
}
