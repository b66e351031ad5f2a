package config_test

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// controller-runtime's default graceful shutdown budget: the manager stops its
// controllers and releases the lease within it.
const managerShutdownSeconds = 30

// The gateway's manager waits this long beyond --shutdown-grace for the rest of its
// shutdown (cmd/gateway: GracefulShutdownTimeout is the grace plus 10 s).
const gatewayShutdownExtra = 10 * time.Second

// pdbs decodes every PodDisruptionBudget config/default applies.
func pdbs(t *testing.T) []policyv1.PodDisruptionBudget {
	t.Helper()
	var out []policyv1.PodDisruptionBudget
	for _, f := range kustomized(t, "default") {
		for _, doc := range documents(t, f) {
			var probe struct{ Kind string }
			if err := yaml.Unmarshal(doc, &probe); err != nil {
				t.Fatal(err)
			}
			if probe.Kind == "PodDisruptionBudget" {
				var pdb policyv1.PodDisruptionBudget
				decodeStrict(t, f, doc, &pdb)
				out = append(out, pdb)
			}
		}
	}
	return out
}

// Two manager replicas survive a drain and a node's loss: a PodDisruptionBudget keeps one
// available, anti-affinity and a spread put them on different nodes and zones when there
// are any (preferred, so a one-node cluster runs both), and the kubelet waits longer than
// the manager's shutdown, so the leader releases its lease instead of being killed.
func TestManagerIsHighlyAvailable(t *testing.T) {
	d, _ := deployed(t)
	checkHighlyAvailable(t, "the manager", d, managerShutdownSeconds*time.Second)
}

// The gateway the same way; the kubelet waits longer than its drain (--shutdown-grace and
// the 10 s after it), so open tunnels get their whole grace period.
func TestGatewayIsHighlyAvailable(t *testing.T) {
	deps, _ := workloads(t)
	d := deps[gatewayDeployment]
	grace := time.Duration(-1)
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-grace="); ok {
			var err error
			if grace, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s: %v", a, err)
			}
		}
	}
	if grace < 0 {
		t.Fatal("the gateway's args lack --shutdown-grace: its default (30s) would be unseen here")
	}
	checkHighlyAvailable(t, "the gateway", d, grace+gatewayShutdownExtra)
}

func checkHighlyAvailable(t *testing.T, who string, d appsv1.Deployment, shutdown time.Duration) {
	t.Helper()
	pod := d.Spec.Template
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: replicas %v, want at least 2", who, d.Spec.Replicas)
	}
	var mine []policyv1.PodDisruptionBudget
	for _, pdb := range pdbs(t) {
		if s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err == nil && s.Matches(labels.Set(pod.Labels)) {
			mine = append(mine, pdb)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("%d of config/default's PodDisruptionBudgets select %s's pods, want 1", len(mine), who)
	}
	pdb := mine[0]
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("%s's PodDisruptionBudget: minAvailable %v maxUnavailable %v, want minAvailable 1", who, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	selects := func(what string, sel *metav1.LabelSelector) {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("%s selects %v, not %s's pods %v (%v)", what, sel, who, pod.Labels, err)
		}
	}
	selects("the PodDisruptionBudget", pdb.Spec.Selector)

	spec := pod.Spec
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil || len(spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Fatalf("%s: affinity %+v: want one preferred pod anti-affinity term and no required one", who, spec.Affinity)
	}
	term := spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("%s: anti-affinity by %q, want kubernetes.io/hostname", who, term.TopologyKey)
	}
	selects("the anti-affinity term", term.LabelSelector)
	if len(spec.TopologySpreadConstraints) != 1 || spec.TopologySpreadConstraints[0].WhenUnsatisfiable != "ScheduleAnyway" {
		t.Fatalf("%s: topology spread %+v: want one, ScheduleAnyway", who, spec.TopologySpreadConstraints)
	}
	selects("the topology spread", spec.TopologySpreadConstraints[0].LabelSelector)
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want more than its %s shutdown", who, g, shutdown)
	}
}
