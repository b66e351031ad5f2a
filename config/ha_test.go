package config_test

import (
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// controller-runtime's default graceful shutdown budget: the manager stops its
// controllers and releases the lease within it.
const managerShutdownSeconds = 30

// Two manager replicas survive a drain and a node's loss: a PodDisruptionBudget keeps one
// available, anti-affinity and a spread put them on different nodes and zones when there
// are any (preferred, so a one-node cluster runs both), and the kubelet waits longer than
// the manager's shutdown, so the leader releases its lease instead of being killed.
func TestManagerIsHighlyAvailable(t *testing.T) {
	d, _ := deployed(t)
	pod := d.Spec.Template
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2", d.Spec.Replicas)
	}
	var pdbs []policyv1.PodDisruptionBudget
	for _, f := range kustomized(t, "default") {
		for _, doc := range documents(t, f) {
			var probe struct{ Kind string }
			if err := yaml.Unmarshal(doc, &probe); err != nil {
				t.Fatal(err)
			}
			if probe.Kind == "PodDisruptionBudget" {
				var pdb policyv1.PodDisruptionBudget
				decodeStrict(t, f, doc, &pdb)
				pdbs = append(pdbs, pdb)
			}
		}
	}
	if len(pdbs) != 1 {
		t.Fatalf("config/default has %d PodDisruptionBudgets, want 1", len(pdbs))
	}
	pdb := pdbs[0]
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("the PodDisruptionBudget: minAvailable %v maxUnavailable %v, want minAvailable 1", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	selects := func(what string, sel *metav1.LabelSelector) {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("%s selects %v, not the manager's pods %v (%v)", what, sel, pod.Labels, err)
		}
	}
	selects("the PodDisruptionBudget", pdb.Spec.Selector)

	spec := pod.Spec
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil || len(spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Fatalf("affinity %+v: want one preferred pod anti-affinity term and no required one", spec.Affinity)
	}
	term := spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity by %q, want kubernetes.io/hostname", term.TopologyKey)
	}
	selects("the anti-affinity term", term.LabelSelector)
	if len(spec.TopologySpreadConstraints) != 1 || spec.TopologySpreadConstraints[0].WhenUnsatisfiable != "ScheduleAnyway" {
		t.Fatalf("topology spread %+v: want one, ScheduleAnyway", spec.TopologySpreadConstraints)
	}
	selects("the topology spread", spec.TopologySpreadConstraints[0].LabelSelector)
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= managerShutdownSeconds {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the manager's %d s shutdown", g, managerShutdownSeconds)
	}
}
