package proxy

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// The build verdict: what to do with a Proxy's instance that the provider reports, decided
// by judgeBuild from facts read beforehand (readBuildFacts) without the API server or the
// provider, and carried out by carryOut (intent.go); before it, judgeGone decides what a
// Get that finds no instance means, carried out by forget (phases.go). verdict_test.go
// tables every rule.

// buildAction is what a verdict does with the instance.
type buildAction string

const (
	// buildKeep keeps the instance: its status is published and remediation asked.
	buildKeep buildAction = "keep"
	// buildReplace deletes the instance to create it again (verdict.why says why).
	buildReplace buildAction = "replace"
	// buildRestart starts the stopped instance as it was built.
	buildRestart buildAction = "restart"
)

// goneVerdict is the verdict on an instance the provider no longer has (judgeGone): it is
// forgotten and created again, with an Event saying why.
type goneVerdict struct {
	event verdictEvent // recorded with action common.ActionGet
	// preempted is the Preempted condition of an instance its cloud reclaimed
	// (provider.ErrPreempted), counted in zone; nil for one simply gone.
	preempted *metav1.Condition
	zone      string
	err       error // the provider's
}

// judgeGone reads the provider's answer to a Get of the Proxy's instance: gone (true) when
// it says ErrNotFound, or ErrPreempted (a Warning Preempted Event with the provider's
// message and the Preempted condition, which stays until the health engine marks the
// successor Ready); anything else (false) is an instance to judge (judgeBuild) or an
// error.
func judgeGone(px *v1alpha1.Proxy, err error) (goneVerdict, bool) {
	switch {
	case errors.Is(err, provider.ErrPreempted):
		zone := px.Spec.Placement.Zone
		if zone == "" {
			zone = "unknown"
		}
		msg := fmt.Sprintf("%v; building its successor %s", err, px.InstanceName())
		return goneVerdict{
			event: verdictEvent{corev1.EventTypeWarning, v1alpha1.ReasonPreempted, msg},
			preempted: &metav1.Condition{
				Type: v1alpha1.ConditionPreempted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPreempted,
				Message: msg + "; this condition stays until the successor is Ready", ObservedGeneration: px.Generation,
			},
			zone: zone, err: err,
		}, true
	case errors.Is(err, provider.ErrNotFound):
		return goneVerdict{event: verdictEvent{corev1.EventTypeWarning, EventInstanceGone,
			fmt.Sprintf("instance %s is gone from provider %s; creating it again", px.Status.ProviderID, px.Spec.Provider)}, err: err}, true
	}
	return goneVerdict{}, false
}

// buildFacts is what the verdict is judged from beside the Proxy itself.
type buildFacts struct {
	want hashes
	// partialIntent is the intent hash over part of spec.proxy (partialIntentHash) with
	// the Secrets the spec names; read only when status records a rendered hash and an
	// intent hash other than want.intent, "" otherwise.
	partialIntent string
	// onlyCredentialsChanged: with the credentials the snapshot keeps, the spec hashes as
	// the instance was built (onlyCredentialsChanged); read only for a pool child whose
	// recorded intent is neither want.intent nor partialIntent.
	onlyCredentialsChanged bool
	// state is the instance's state as the provider reports it.
	state string
}

// verdictEvent is an Event a verdict records, with action common.ActionReconcile.
type verdictEvent struct {
	typ, reason, message string
}

// recorded is what status records of the instance's build.
type recorded struct {
	specHash, renderedHash, observedReplace string
}

// buildVerdict is what judgeBuild decides, as data.
type buildVerdict struct {
	action buildAction
	why    string // of a replacement
	// record is what status records after the verdict (the hashes adopted, the replace
	// annotation value seen); the same as before when nothing is adopted.
	record recorded
	// syncSnapshot: the credentials snapshot is made to hold the referenced Secret's
	// credentials (or deleted, without any), before the Events are recorded.
	syncSnapshot bool
	// condition is the ConfigOutdated condition to set, nil to leave it.
	condition *metav1.Condition
	events    []verdictEvent
}

func (v *buildVerdict) event(typ, reason, format string, args ...any) {
	v.events = append(v.events, verdictEvent{typ, reason, fmt.Sprintf(format, args...)})
}

// outdated sets the verdict's ConfigOutdated condition, with a Normal Event when it turns
// True or changes reason (configOutdatedNews).
func (v *buildVerdict) outdated(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason, message string) {
	if configOutdatedNews(px, status, reason) {
		v.event(corev1.EventTypeNormal, reason, "ConfigOutdated: %s", message)
	}
	c := configOutdatedCondition(px, status, reason, message)
	v.condition = &c
}

// configOutdatedCondition is the ConfigOutdated condition of px's generation.
func configOutdatedCondition(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionConfigOutdated, Status: status, Reason: reason,
		Message: message, ObservedGeneration: px.Generation}
}

// configOutdatedNews reports a ConfigOutdated condition that turns True or changes reason
// while True: it is told with an Event.
func configOutdatedNews(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason string) bool {
	old := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionConfigOutdated)
	return status == metav1.ConditionTrue && (old == nil || old.Status != status || old.Reason != reason)
}

// upToDateMessage is ConfigOutdated=False's message.
func upToDateMessage(px *v1alpha1.Proxy) string {
	return fmt.Sprintf("instance %s runs the configuration this operator version builds for the spec", px.InstanceName())
}

// judgeBuild compares the running instance with what the operator would build now and
// decides whether to keep, replace or restart it. On the way it adopts an instance built
// by an operator version that recorded no intent hash, or an intent hash over part of
// spec.proxy (adoptPartialIntent), and sets ConfigOutdated:
//   - a new intent (spec edited, password rotated) replaces the instance, except a pool
//     child's whose spec is unchanged: its pool replaces it surge-first
//     (ConfigOutdated=True, CredentialsChanged) while it keeps serving with its snapshot;
//   - a new rendering alone (an operator upgrade) keeps it (ConfigOutdated=True,
//     RenderingChanged) until a standalone Proxy's replace annotation gets a new value
//     or, for a pool child, its pool replaces it;
//   - a new replace annotation value rebuilds a standalone Proxy's instance in any case.
//
// An instance kept that is stopped (or in a state the provider cannot tell) is restarted.
func judgeBuild(px *v1alpha1.Proxy, f buildFacts) buildVerdict {
	v := judgeIntent(px, f)
	if v.action == buildKeep && (f.state == provider.StateStopped || f.state == provider.StateUnknown) {
		v.action = buildRestart
	}
	return v
}

// judgeIntent is judgeBuild without the instance's state: keep or replace.
func judgeIntent(px *v1alpha1.Proxy, f buildFacts) buildVerdict {
	st := &px.Status
	want := f.want
	pool := controllingPool(px)
	v := buildVerdict{action: buildKeep, record: recorded{st.SpecHash, st.RenderedHash, st.ObservedReplace}}
	if st.RenderedHash == "" {
		// Built before the intent hash was recorded: status.specHash holds what is now the
		// rendered hash, of that version's rendering. It is adopted whether it matches this
		// version's rendering or not: a mismatch cannot be told from a rendering this
		// version changed, and replacing on a guess would replace every such instance at
		// once. A mismatch shows ConfigOutdated (RenderingChanged) below, and rolls like
		// any rendering change: a pool surge-first, a standalone Proxy on the annotation.
		built := st.SpecHash
		v.record = recorded{want.intent, built, px.Annotations[v1alpha1.ReplaceAnnotation]}
		v.syncSnapshot = true
		if built == want.rendered {
			v.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted,
				"instance %s, built by an earlier operator version, is kept as it is: it matches the spec (spec hash %s, rendered hash %s)",
				px.InstanceName(), want.intent, want.rendered)
		} else {
			v.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted,
				"instance %s, built by an earlier operator version from another rendering (hash %s; this version's is %s), is kept as it is and shown ConfigOutdated",
				px.InstanceName(), built, want.rendered)
		}
	}
	if why := adoptPartialIntent(px, f, &v); why != "" {
		return replaceVerdict(v, why)
	}
	if v.record.specHash != want.intent {
		if pool != "" && f.onlyCredentialsChanged {
			v.outdated(px, metav1.ConditionTrue, v1alpha1.ReasonCredentialsChanged, fmt.Sprintf(
				"the credentials Secret %s changed; instance %s keeps serving with the credentials it was built with (Secret %s) until ProxyPool %s replaces it",
				px.Spec.Proxy.BasicAuth.SecretRef.Name, px.InstanceName(), st.CredentialsSecret, pool))
			return v
		}
		return replaceVerdict(v, "spec changed")
	}
	if a := px.Annotations[v1alpha1.ReplaceAnnotation]; a != "" && a != v.record.observedReplace {
		if pool == "" {
			return replaceVerdict(v, fmt.Sprintf("replacement asked for by annotation %s=%q", v1alpha1.ReplaceAnnotation, a))
		}
		v.record.observedReplace = a
		v.event(corev1.EventTypeWarning, v1alpha1.ReasonReplaceIgnored,
			"annotation %s=%q is ignored on a child of ProxyPool %s: the pool replaces its children (surge-first) when their ConfigOutdated condition is True or its template changes",
			v1alpha1.ReplaceAnnotation, a, pool)
	}
	if v.record.renderedHash != want.rendered {
		// Another version's rendering, after an upgrade; or, for a Proxy adopted from a
		// version whose intent missed part of spec.proxy, possibly an edit of that part.
		msg := fmt.Sprintf("instance %s was built from another rendering (rendered hash %s) than this operator version makes of the spec (%s): "+
			"another operator version built it, or an earlier one kept it when spec.proxy.allowedDestinations or allowOpenProxy was edited; it keeps running as it is; ",
			px.InstanceName(), v.record.renderedHash, want.rendered)
		if pool != "" {
			msg += fmt.Sprintf("ProxyPool %s replaces it surge-first", pool)
		} else {
			msg += fmt.Sprintf("to build it again: kubectl annotate proxy -n %s %s %s=\"$(date +%%s)\" --overwrite", px.Namespace, px.Name, v1alpha1.ReplaceAnnotation)
		}
		v.outdated(px, metav1.ConditionTrue, v1alpha1.ReasonRenderingChanged, msg)
		return v
	}
	// The intent matches, so the referenced Secret holds what the instance was built
	// with: a snapshot lost since is made again from it.
	v.syncSnapshot = true
	v.outdated(px, metav1.ConditionFalse, v1alpha1.ReasonUpToDate, upToDateMessage(px))
	return v
}

// replaceVerdict is v turned into a replacement for why. The replacement records the
// hashes and the replace annotation itself (replace), after the new instance is built.
func replaceVerdict(v buildVerdict, why string) buildVerdict {
	v.action, v.why = buildReplace, why
	return v
}

// adoptPartialIntent takes over an instance whose status.specHash an operator version
// that covered only part of spec.proxy recorded (partialIntentHash) and that still
// matches the spec: the hash is new, not the user's intent. A pool child is kept (a
// rendering that differs shows ConfigOutdated below, and its pool replaces it
// surge-first), and so is a standalone Proxy built from this version's rendering. A
// standalone Proxy built from another rendering is replaced: allowedDestinations or
// allowOpenProxy may have been edited under that version, which kept the instance, and
// that cannot be told from an operator upgrade; keeping it could keep a fence the user
// narrowed open. It returns why the instance must be replaced, or "".
func adoptPartialIntent(px *v1alpha1.Proxy, f buildFacts, v *buildVerdict) string {
	if v.record.specHash == f.want.intent || f.partialIntent == "" || f.partialIntent != v.record.specHash {
		return ""
	}
	if v.record.renderedHash != f.want.rendered && controllingPool(px) == "" {
		return "spec.proxy.allowedDestinations or allowOpenProxy may have been edited under an earlier operator version, which kept the instance built before the edit"
	}
	v.record.specHash = f.want.intent
	v.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted,
		"instance %s is kept: its spec hash %s, recorded by an earlier operator version over part of spec.proxy, matches the spec; this version's, over all of it, is %s",
		px.InstanceName(), f.partialIntent, f.want.intent)
	return ""
}
