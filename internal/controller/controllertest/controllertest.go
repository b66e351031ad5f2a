package controllertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// TestProvider is the name the tests give the fake provider (providertest.Fake).
const TestProvider = "fake-home"

// Main runs a controller package's tests (from its TestMain) with the one API server
// they share, started by the first test that needs it. TEST_LOG=1 shows the
// controllers' log lines.
func Main(m *testing.M, shared *testenv.Shared) {
	logOut := io.Discard
	if os.Getenv("TEST_LOG") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	os.Exit(shared.Run(m))
}

// Parallel lets up to n of the package's parallel tests (those that call t.Parallel) run
// at once, unless the command line sets -parallel (-test.parallel) itself. Call it from
// TestMain before Main. go test's default is GOMAXPROCS, but a controller test spends its
// time waiting on the API server, its manager's queues and its polls rather than on a
// CPU, so more of them than there are cores fit at once.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", fmt.Sprint(n)); err != nil {
			panic(err)
		}
	}
}

// ApplyHealthStatus applies the health engine's part of px's status, as it does.
func ApplyHealthStatus(ctx context.Context, c client.Client, px *v1alpha1.Proxy) error {
	st := px.Status
	own := &v1alpha1.ProxyStatus{Healthy: st.Healthy, ProbeTarget: st.ProbeTarget, LastProbeTime: st.LastProbeTime,
		ProbeLatencyMilliseconds: st.ProbeLatencyMilliseconds, EgressIP: st.EgressIP, ConsecutiveProbeFailures: st.ConsecutiveProbeFailures}
	for _, cd := range st.Conditions {
		if cd.Type == v1alpha1.ConditionHealthy {
			if cd.LastTransitionTime.IsZero() {
				cd.LastTransitionTime = metav1.Now()
			}
			own.Conditions = append(own.Conditions, cd)
		}
	}
	return statusapply.Status(ctx, c, px.DeepCopy(), own, statusapply.ProxyHealth)
}

// NoWatch lets interceptor wrap a manager's client, which has no Watch.
type NoWatch struct{ client.Client }

// Watch refuses.
func (NoWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("watch is not supported here")
}

// CheckAdmission dry-runs the creation, through c, of a Proxy with spec and fails the
// test unless the API server accepts it (want "") or refuses it with an error
// containing want.
func CheckAdmission(t *testing.T, ctx context.Context, c client.Client, spec v1alpha1.ProxySpec, want string) {
	t.Helper()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "default"}, Spec: spec}
	err := c.Create(ctx, px, client.DryRunAll)
	switch {
	case want == "" && err != nil:
		t.Fatalf("rejected: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error %v, want one saying %q", err, want)
	}
}

// FuncClock is a clock.PassiveClock whose time is what the function says.
type FuncClock func() time.Time

// Now is f().
func (f FuncClock) Now() time.Time { return f() }

// Since is the time from t to f().
func (f FuncClock) Since(t time.Time) time.Duration { return f().Sub(t) }

// UpgradeRendering acts as an operator upgrade whose rendering differs from today's, for
// the rest of the test.
func UpgradeRendering(t *testing.T, variant string) {
	t.Helper()
	t.Cleanup(proxyconfig.SetRenderingVariant(variant))
}

// ConfigOutdated is the Proxy's ConfigOutdated condition (empty when it has none).
func ConfigOutdated(px *v1alpha1.Proxy) metav1.Condition {
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionConfigOutdated); c != nil {
		return *c
	}
	return metav1.Condition{}
}
