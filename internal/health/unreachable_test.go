package health

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
)

// feedbackSide is a manager replica's feedback recorder and discovery server over the
// env's manager cache, as cmd/manager wires them beside the engine.
type feedbackSide struct {
	e     *engineEnv
	h     http.Handler
	token string
}

func (e *engineEnv) feedbackSide(holdoff time.Duration) *feedbackSide {
	e.t.Helper()
	rec := &bans.Recorder{Client: e.mgr.GetClient(), Reader: e.mgr.GetClient(), APIReader: e.mgr.GetAPIReader(),
		Policy: bans.DefaultPolicy, UnreachableHoldoff: holdoff}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- rec.Start(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	src, err := discovery.NewCacheSource(e.ctx, e.mgr.GetCache())
	if err != nil {
		e.t.Fatal(err)
	}
	const token = "unreachable-test-token"
	file := filepath.Join(e.t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		e.t.Fatal(err)
	}
	srv, err := discovery.New(src, discovery.Options{Feedback: rec, TokenFile: file})
	if err != nil {
		e.t.Fatal(err)
	}
	return &feedbackSide{e: e, h: srv.Handler(), token: token}
}

// report posts an unreachable report of the named proxy.
func (f *feedbackSide) report(name string) {
	f.e.t.Helper()
	body := fmt.Sprintf(`{"reports":[{"proxy":"%s/%s","outcome":"unreachable"}]}`, f.e.ns, name)
	req := httptest.NewRequest(http.MethodPost, "/v1/feedback", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+f.token)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	if b, _ := io.ReadAll(rec.Result().Body); rec.Code != http.StatusOK || !strings.Contains(string(b), `"accepted":1`) {
		f.e.t.Fatalf("reporting %s unreachable: %d %s", name, rec.Code, b)
	}
}

// listed reports whether discovery's healthy list of the namespace has the named proxy.
func (f *feedbackSide) listed(name string) bool {
	req := httptest.NewRequest(http.MethodGet, "/v1/proxies?format=text&namespace="+f.e.ns, nil)
	req.Header.Set("Authorization", "Bearer "+f.token)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	px := f.e.get(name)
	return strings.Contains(rec.Body.String(), fmt.Sprintf("http://%s:%d\n", px.Status.IP, px.Spec.Port))
}

// counter reads a counter of the manager's metrics registry by its label value.
func counter(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// answered reports whether a probe has answered px's unreachable report, and how.
func answered(px *v1alpha1.Proxy) (bool, bool) {
	u, p := px.Status.Unreachable, px.Status.UnreachableProbe
	if u == nil || p == nil || !p.ReportedAt.Equal(&u.ReportedAt) {
		return false, false
	}
	return true, p.Passed
}

// A proxy reported unreachable is probed at once (the rounds are an hour apart here);
// the probe passes, and it is handed out again. Reports within the holdoff after that
// are ignored: no mark, no probe, the proxy stays in the answers.
func TestUnreachableReportProbedAtOnceAndLiarsBounded(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "127.0.0.6")
	e.proxyAt("victim", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseReady)
	e.startWatching(nil)
	fs := e.feedbackSide(time.Minute)
	waitFor(t, waitLong, "proxy victim healthy and listed", func() (bool, error) {
		return e.get("victim").Status.Healthy && fs.listed("victim"), nil
	})
	probes := fp.Requests.Load()
	passed := counter(t, "proxy_operator_proxy_unreachable_probes_total", "result", "passed")

	start := time.Now()
	fs.report("victim")
	var px *v1alpha1.Proxy
	waitFor(t, waitLong, "a passing probe to answer the report", func() (bool, error) {
		px = e.get("victim")
		done, ok := answered(px)
		return done && ok, nil
	})
	took := time.Since(start)
	t.Logf("report -> answered by a passing probe in %v", took.Round(time.Millisecond))
	if fp.Requests.Load() != probes+1 {
		t.Errorf("%d probes after the report, want 1", fp.Requests.Load()-probes)
	}
	if !px.Status.Healthy || px.Status.ConsecutiveProbeFailures != 0 {
		t.Errorf("status after a passing answer: %+v", px.Status)
	}
	// The counter moves just after the status write the wait above saw, so it is
	// waited for too; it must settle at +1, not more.
	waitFor(t, waitLong, "the unreachable probes counter to count the passing answer", func() (bool, error) {
		d := counter(t, "proxy_operator_proxy_unreachable_probes_total", "result", "passed") - passed
		return d == 1, fmt.Errorf("passed +%v", d)
	})
	waitFor(t, waitLong, "proxy victim listed again", func() (bool, error) { return fs.listed("victim"), nil })

	// A crawler that goes on reporting it: ignored for the holdoff.
	ignored := counter(t, "proxy_operator_feedback_unreachable_total", "result", bans.UnreachableIgnored)
	for range 5 {
		fs.report("victim")
	}
	waitFor(t, waitLong, "the recorder to ignore the 5 reports", func() (bool, error) {
		d := counter(t, "proxy_operator_feedback_unreachable_total", "result", bans.UnreachableIgnored) - ignored
		return d == 5, fmt.Errorf("ignored +%v", d)
	})
	after := e.get("victim")
	if bans.UnreachableOpen(&after.Status) || !after.Status.Unreachable.ReportedAt.Equal(&px.Status.Unreachable.ReportedAt) {
		t.Errorf("reports within the holdoff changed the mark: %+v", after.Status.Unreachable)
	}
	if !fs.listed("victim") || fp.Requests.Load() != probes+1 {
		t.Errorf("within the holdoff: listed %v, %d probes since the first report; want listed and 1", fs.listed("victim"), fp.Requests.Load()-probes)
	}
}

// A proxy reported unreachable whose prompt probe fails is taken out as unhealthy at
// once, not after the threshold's three failures.
func TestUnreachableReportConfirmedByAFailedProbe(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "127.0.0.7")
	e.proxyAt("dead", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseReady)
	e.startWatching(nil)
	fs := e.feedbackSide(time.Minute)
	waitFor(t, waitLong, "proxy dead healthy and listed", func() (bool, error) {
		return e.get("dead").Status.Healthy && fs.listed("dead"), nil
	})
	fp.SetMode(healthtest.Fail)

	start := time.Now()
	fs.report("dead")
	var px *v1alpha1.Proxy
	waitFor(t, waitLong, "a failing probe to answer the report", func() (bool, error) {
		px = e.get("dead")
		done, ok := answered(px)
		return done && !ok, nil
	})
	t.Logf("report -> confirmed unhealthy in %v", time.Since(start).Round(time.Millisecond))
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if px.Status.Healthy || px.Status.ConsecutiveProbeFailures != 1 || c == nil || c.Status != "False" || c.Reason != v1alpha1.ReasonProbeFailed {
		t.Errorf("after one failed probe answering the report: healthy %v, %d failures, condition %+v; want unhealthy at once",
			px.Status.Healthy, px.Status.ConsecutiveProbeFailures, c)
	}
	if fs.listed("dead") {
		t.Error("the proxy is still listed")
	}
	e.waitEvent("dead", v1alpha1.ReasonProbeFailed, 1)
}
