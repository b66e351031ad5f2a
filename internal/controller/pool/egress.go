package pool

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// A pool with spec.egress.wireguard hands each new child a WireGuard configuration (a
// Secret its selector matches) that no child of the pool holds, recorded in the child's
// spec.proxy.egress.wireguard.assignedSecretRef. A child holds its configuration until it
// is gone, deletion included (its VM may still run the tunnel), so two live tunnels
// never share a key. With fewer free configurations than children to make, the pool
// makes as many as it can and says so in EgressExhausted; a replacement then happens
// only delete-first, as far as maxUnavailable lets the plan delete the old child.

// poolEgress is what a pool with spec.egress.wireguard has to hand out.
type poolEgress struct {
	selector labels.Selector
	matching int      // WireGuard exits the selector matches (opted in, not skipped)
	free     []string // of those, the ones no child holds, by name; assignment takes from the front
	// skipped are the opted-in Secrets the selector matches that are not exits, by
	// name: never handed to a child, named in EgressExhausted.
	skipped []skippedSecret
	// needed is how many children this pass wanted to make, freeBefore how many
	// configurations were free then.
	needed, freeBefore int
}

// skippedSecret is a Secret a pool's selector matches that is no WireGuard exit, and why.
type skippedSecret struct{ name, why string }

// wireGuardSelector is the pool's spec.egress.wireguard.secretSelector, or nil.
func wireGuardSelector(pool *v1alpha1.ProxyPool) *metav1.LabelSelector {
	if pool.Spec.Egress == nil || pool.Spec.Egress.WireGuard == nil {
		return nil
	}
	return &pool.Spec.Egress.WireGuard.SecretSelector
}

// readEgress finds the pool's WireGuard Secrets and which of them its children leave
// free. A selector the API server took but labels cannot parse is a spec error.
func (r *ProxyPoolReconciler) readEgress(ctx context.Context, s *poolScope) error {
	ls := wireGuardSelector(s.pool)
	if ls == nil {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		s.specErr = fmt.Errorf("proxy pool %s/%s: spec.egress.wireguard.secretSelector: %w", s.pool.Namespace, s.pool.Name, err)
		return nil
	}
	list := &corev1.SecretList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.pool.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return fmt.Errorf("listing the WireGuard secrets of proxy pool %s/%s: %w", s.pool.Namespace, s.pool.Name, err)
	}
	held := map[string]bool{}
	for _, c := range s.children {
		if name := assignedWireGuard(c.px); name != "" {
			held[name] = true
		}
	}
	e := &poolEgress{selector: sel}
	for i := range list.Items {
		sec := &list.Items[i]
		if !proxyconfig.OptedIn(sec) {
			continue
		}
		if why := notAnExit(sec); why != "" {
			e.skipped = append(e.skipped, skippedSecret{sec.Name, why})
			continue
		}
		e.matching++
		if !held[sec.Name] {
			e.free = append(e.free, sec.Name)
		}
	}
	slices.Sort(e.free)
	slices.SortFunc(e.skipped, func(a, b skippedSecret) int { return strings.Compare(a.name, b.name) })
	s.egress = e
	return nil
}

// notAnExit says why a Secret is no WireGuard exit, or "" when it is one. A selector
// that matches the opt-in label alone also matches the template's basic-auth Secret and
// the credentials snapshot of every child (internal/controller/proxy/snapshot.go), one more with each child:
// handed to a child, either would leave it waiting for a configuration forever.
func notAnExit(sec *corev1.Secret) string {
	if ref, ok := v1alpha1.ControllingProxy(sec); ok {
		return "the credentials snapshot of proxy " + ref.Name
	}
	if len(bytes.TrimSpace(sec.Data[proxyconfig.SecretKeyWireGuard])) == 0 {
		return fmt.Sprintf("no key %s", proxyconfig.SecretKeyWireGuard)
	}
	return ""
}

// skippedMessage names the Secrets skipped as not exits ("" when none), at most common.MaxNamed.
func (e *poolEgress) skippedMessage() string {
	if len(e.skipped) == 0 {
		return ""
	}
	parts := make([]string, len(e.skipped))
	for i, sk := range e.skipped {
		parts[i] = fmt.Sprintf("%s (%s)", sk.name, sk.why)
	}
	return fmt.Sprintf("; it also matches %d Secrets that are not WireGuard exits and are never handed out: %s",
		len(e.skipped), common.NameList(parts))
}

// assignedWireGuard is the Secret a child was given, or "".
func assignedWireGuard(px *v1alpha1.Proxy) string {
	p := px.Spec.Proxy
	if p == nil || p.Egress == nil || p.Egress.WireGuard == nil || p.Egress.WireGuard.AssignedSecretRef == nil {
		return ""
	}
	return string(p.Egress.WireGuard.AssignedSecretRef.Name)
}

// capCreate records that the pass wants n children and returns how many it may make:
// one per free configuration.
func (e *poolEgress) capCreate(n int) int {
	if e == nil {
		return n
	}
	e.needed, e.freeBefore = n, len(e.free)
	return min(n, len(e.free))
}

// assign gives px the next free configuration.
func (e *poolEgress) assign(px *v1alpha1.Proxy) {
	if e == nil {
		return
	}
	name := e.free[0]
	e.free = e.free[1:]
	if px.Spec.Proxy == nil {
		px.Spec.Proxy = &v1alpha1.ProxyConfig{}
	}
	px.Spec.Proxy.Egress = &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{
		AssignedSecretRef: &v1alpha1.WireGuardSecretRef{Name: v1alpha1.SecretName(name)}}}
}

// setEgressExhausted sets EgressExhausted for a pool with spec.egress.wireguard and
// removes it from one without.
func (s *poolScope) setEgressExhausted() {
	conds := &s.pool.Status.Conditions
	e := s.egress
	if e == nil {
		meta.RemoveStatusCondition(conds, v1alpha1.PoolConditionEgressExhausted)
		return
	}
	cond := metav1.Condition{Type: v1alpha1.PoolConditionEgressExhausted, ObservedGeneration: s.pool.Generation}
	switch {
	case e.needed > e.freeBefore && e.matching == 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress
		cond.Message = fmt.Sprintf("spec.egress.wireguard.secretSelector (%s) matches no WireGuard Secret (labelled %s=true, holding %s) in namespace %s; "+
			"%d children wait for one each", selectorString(e.selector), v1alpha1.CredentialsLabel, proxyconfig.SecretKeyWireGuard, s.pool.Namespace, e.needed)
	case e.needed > e.freeBefore:
		cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress
		cond.Message = fmt.Sprintf("has %d free WireGuard configurations and needs %d: spec.egress.wireguard.secretSelector (%s) matches %d, "+
			"the others held by children (two children never share one: two peers with one key break each other's tunnel); add Secrets that match",
			e.freeBefore, e.needed, selectorString(e.selector), e.matching)
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable
		cond.Message = fmt.Sprintf("%d of the %d WireGuard configurations spec.egress.wireguard.secretSelector matches are free", len(e.free), e.matching)
	}
	cond.Message += e.skippedMessage()
	meta.SetStatusCondition(conds, cond)
}

func selectorString(sel labels.Selector) string {
	if sel.Empty() {
		return "every Secret"
	}
	return sel.String()
}

// poolsForWireGuardSecret maps a Secret to the pools of its namespace whose
// spec.egress.wireguard.secretSelector matches it: a new or freed configuration may let
// a waiting pool go on.
func (r *ProxyPoolReconciler) poolsForWireGuardSecret(ctx context.Context, sec client.Object) []client.ObjectKey {
	list := &v1alpha1.ProxyPoolList{}
	if err := r.Client.List(ctx, list, client.InNamespace(sec.GetNamespace())); err != nil {
		return nil
	}
	var out []client.ObjectKey
	for i := range list.Items {
		ls := wireGuardSelector(&list.Items[i])
		if ls == nil {
			continue
		}
		if sel, err := metav1.LabelSelectorAsSelector(ls); err == nil && sel.Matches(labels.Set(sec.GetLabels())) {
			out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return out
}
