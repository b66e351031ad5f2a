package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// columns parses kubectl's table output into header -> value rows.
func columns(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	// Column starts: where a header word begins after two spaces or at 0.
	var starts []int
	var names []string
	for i := 0; i < len(header); i++ {
		if header[i] != ' ' && (i == 0 || (i >= 2 && header[i-1] == ' ' && header[i-2] == ' ')) {
			starts = append(starts, i)
			end := strings.Index(header[i:], "  ")
			if end < 0 {
				end = len(header) - i
			}
			names = append(names, header[i:i+end])
		}
	}
	var rows []map[string]string
	for _, l := range lines[1:] {
		row := map[string]string{}
		for j, s := range starts {
			e := len(l)
			if j+1 < len(starts) && starts[j+1] < e {
				e = starts[j+1]
			}
			if s < len(l) {
				row[names[j]] = strings.TrimSpace(l[s:e])
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// What kubectl shows of the CRDs, against a real API server with them installed:
// HEALTHY is the Healthy condition's status, so an unhealthy proxy (no status.healthy)
// shows False, not a blank; kubectl get px -o wide adds the egress IP, the running VM's
// age (none for an External proxy) and the last probe latency;
// kubectl get ppool -o wide the pool's progress reason, its demand and the Scaling
// condition's reason; kubectl get egress lists all
// three kinds, each by its short name too.
func TestKubectlGetShowsTheColumns(t *testing.T) {
	kubectl := kubectlBin(t)
	env := testenv.StartT(t)
	ctx := testenv.Context(t)
	ns := env.Namespace(t, ctx, "kubectl")
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	get := func(args ...string) string {
		t.Helper()
		out, err := run(kubectl, append([]string{"--kubeconfig", kc, "-n", ns, "get"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}

	// A Managed proxy whose VM runs and whose probes pass; an External one (no VM) whose
	// probes fail: its status has no healthy field at all.
	setStatus := func(px *v1alpha1.Proxy, st v1alpha1.ProxyStatus) {
		t.Helper()
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		px.Status = st
		if err := env.Client.Status().Update(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason, LastTransitionTime: metav1.Now()}
	}
	setStatus(&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns},
		Spec: v1alpha1.ProxySpec{Provider: "kvm2-home", Port: 3128}},
		v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "192.0.2.11", EgressIP: "198.51.100.7", Healthy: true, ProbeLatencyMilliseconds: 42,
			Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionProvisioned, metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
				cond(v1alpha1.ConditionHealthy, metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded)}})
	setStatus(&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.10", Port: 3128}},
		v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, IP: "192.0.2.10",
			Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionProvisioned, metav1.ConditionTrue, v1alpha1.ReasonExternal),
				cond(v1alpha1.ConditionHealthy, metav1.ConditionFalse, v1alpha1.ReasonProbeFailed)}})

	narrow := columns(t, get("px"))
	if _, ok := narrow[0]["EGRESS IP"]; ok {
		t.Errorf("kubectl get px shows EGRESS IP without -o wide: %v", narrow)
	}
	wide := columns(t, get("px", "-o", "wide"))
	if len(wide) != 2 {
		t.Fatalf("kubectl get px -o wide: %v", wide)
	}
	rows := map[string]map[string]string{}
	for _, r := range wide {
		rows[r["NAME"]] = r
	}
	for name, want := range map[string]map[string]string{
		"vm":   {"IP": "192.0.2.11", "EGRESS IP": "198.51.100.7", "LATENCY (MS)": "42", "HEALTHY": "True", "PHASE": "Ready"},
		"edge": {"IP": "192.0.2.10", "HEALTHY": "False", "PHASE": "Running", "VM AGE": ""},
	} {
		for col, w := range want {
			if got := rows[name][col]; got != w {
				t.Errorf("kubectl get px -o wide, %s: %s is %q, want %q (row %v)", name, col, got, w, rows[name])
			}
		}
	}
	if age := rows["vm"]["VM AGE"]; age == "" || age == "<none>" || !strings.HasSuffix(age, "s") {
		t.Errorf("kubectl get px -o wide: VM AGE %q, want the running VM's age in seconds (row %v)", age, rows["vm"])
	}

	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "news", Namespace: ns}}
	pool.Spec.Replicas = ptr.To(int32(2))
	pool.Spec.Template.Spec.Provider = "kvm2-home"
	pool.Spec.Template.Spec.Port = 3128
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{Type: v1alpha1.PoolConditionProgressing, Status: metav1.ConditionFalse, Reason: v1alpha1.PoolReasonProgressDeadlineExceeded, Message: "stuck"})
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{Type: v1alpha1.PoolConditionScaling, Status: metav1.ConditionTrue, Reason: v1alpha1.PoolReasonHeldByDelay, Message: "held"})
	pool.Status.UpToDateReplicas = 1
	pool.Status.Autoscaling = &v1alpha1.PoolAutoscalingStatus{DesiredReplicas: 2,
		Demand: v1alpha1.PoolDemand{Sessions: resource.MustParse("12"), RequestsPerSecond: resource.MustParse("3")}}
	if err := env.Client.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pr := columns(t, get("ppool", "-o", "wide"))
	if len(pr) != 1 || pr[0]["PROGRESS"] != v1alpha1.PoolReasonProgressDeadlineExceeded || pr[0]["UP-TO-DATE"] != "1" || pr[0]["DESIRED"] != "2" ||
		pr[0]["DEMAND"] != "12" || pr[0]["SCALING"] != v1alpha1.PoolReasonHeldByDelay {
		t.Errorf("kubectl get ppool -o wide: %v, want PROGRESS %s, UP-TO-DATE 1, DESIRED 2, DEMAND 12, SCALING %s", pr,
			v1alpha1.PoolReasonProgressDeadlineExceeded, v1alpha1.PoolReasonHeldByDelay)
	}

	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "kvm2-home-" + ns}}
	if err := env.Client.Create(ctx, ph); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, ph, client.PropagationPolicy(metav1.DeletePropagationBackground)) })

	all := get("egress", "-o", "name")
	for _, want := range []string{"proxy.egress.hrajfrisbee.cz/edge", "proxypool.egress.hrajfrisbee.cz/news", "providerhealth.egress.hrajfrisbee.cz/kvm2-home-" + ns} {
		if !strings.Contains(all, want) {
			t.Errorf("kubectl get egress lacks %s:\n%s", want, all)
		}
	}
	for short, kind := range map[string]string{"px": "proxy", "ppool": "proxypool", "ph": "providerhealth"} {
		if out := get(short, "-o", "name"); !strings.Contains(out, kind+".egress.hrajfrisbee.cz/") {
			t.Errorf("kubectl get %s: %q, want %s objects", short, out, kind)
		}
	}
}
