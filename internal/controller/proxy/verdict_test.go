package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// The hashes of the verdict table: what this version makes of the spec (intent,
// rendered), what an earlier version recorded over part of spec.proxy (partial), and
// others (older: an earlier intent; otherRender: another version's rendering).
const (
	vIntent      = "1111111111111111"
	vRendered    = "2222222222222222"
	vPartial     = "3333333333333333"
	vOlder       = "4444444444444444"
	vOtherRender = "5555555555555555"
)

// verdictProxy is a Managed Proxy with basic auth whose status says its instance was
// built from this version's intent and rendering, up to date, unless a case changes it.
func verdictProxy(mutate ...func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fence", Namespace: "crawl", Generation: 3},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Provider: "home", Port: 3128,
			Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth-v2"}}}},
		Status: v1alpha1.ProxyStatus{SpecHash: vIntent, RenderedHash: vRendered, CredentialsSecret: "fence-credentials",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonUpToDate}}},
	}
	for _, m := range mutate {
		m(px)
	}
	return px
}

func poolChild(px *v1alpha1.Proxy) {
	px.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool",
		Name: "crawlers", UID: types.UID("0d1e-pool-uid"), Controller: ptr.To(true)}}
}

func recordedHashes(spec, rendered string) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) { px.Status.SpecHash, px.Status.RenderedHash = spec, rendered }
}

func annotated(value, observed string) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) {
		px.Annotations = map[string]string{v1alpha1.ReplaceAnnotation: value}
		px.Status.ObservedReplace = observed
	}
}

func outdatedAs(reason string) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) {
		px.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionTrue, Reason: reason}}
	}
}

// wantCondition is the ConfigOutdated condition a verdict sets: its status, reason and a
// part of its message; a zero one sets none.
type wantCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message string
}

var (
	upToDateCond  = wantCondition{metav1.ConditionFalse, v1alpha1.ReasonUpToDate, "runs the configuration this operator version builds"}
	standaloneOld = wantCondition{metav1.ConditionTrue, v1alpha1.ReasonRenderingChanged, "kubectl annotate proxy -n crawl fence " + v1alpha1.ReplaceAnnotation}
	childOld      = wantCondition{metav1.ConditionTrue, v1alpha1.ReasonRenderingChanged, "ProxyPool crawlers replaces it surge-first"}
	credsOld      = wantCondition{metav1.ConditionTrue, v1alpha1.ReasonCredentialsChanged,
		"the credentials Secret auth-v2 changed; instance " + (&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "fence", Namespace: "crawl"}}).InstanceName() +
			" keeps serving with the credentials it was built with (Secret fence-credentials) until ProxyPool crawlers replaces it"}
)

// wantEvent is an Event a verdict records: type, reason and a part of its message.
type wantEvent struct{ typ, reason, message string }

var (
	adoptedMatching = wantEvent{corev1.EventTypeNormal, v1alpha1.ReasonAdopted, "built by an earlier operator version, is kept as it is: it matches the spec (spec hash " + vIntent + ", rendered hash " + vRendered + ")"}
	adoptedOther    = wantEvent{corev1.EventTypeNormal, v1alpha1.ReasonAdopted, "from another rendering (hash " + vOtherRender + "; this version's is " + vRendered + "), is kept as it is and shown ConfigOutdated"}
	adoptedPartial  = wantEvent{corev1.EventTypeNormal, v1alpha1.ReasonAdopted, "its spec hash " + vPartial + ", recorded by an earlier operator version over part of spec.proxy, matches the spec; this version's, over all of it, is " + vIntent}
	renderingEvent  = wantEvent{corev1.EventTypeNormal, v1alpha1.ReasonRenderingChanged, "ConfigOutdated: instance "}
	credsEvent      = wantEvent{corev1.EventTypeNormal, v1alpha1.ReasonCredentialsChanged, "ConfigOutdated: the credentials Secret auth-v2 changed"}
	ignoredEvent    = wantEvent{corev1.EventTypeWarning, v1alpha1.ReasonReplaceIgnored, `annotation ` + v1alpha1.ReplaceAnnotation + `="7" is ignored on a child of ProxyPool crawlers`}
)

// Every rule of judgeBuild, decided without the API server or a provider: what it does
// with the instance, what status then records, whether the snapshot is synced, the
// ConfigOutdated condition and the Events. judgeBuild changes nothing of the Proxy.
func TestBuildVerdict(t *testing.T) {
	facts := func(partial string, onlyCreds bool, state string) buildFacts {
		return buildFacts{want: hashes{intent: vIntent, rendered: vRendered}, partialIntent: partial, onlyCredentialsChanged: onlyCreds, state: state}
	}
	running := facts("", false, provider.StateRunning)
	same := recorded{vIntent, vRendered, ""}
	for _, c := range []struct {
		name   string
		px     *v1alpha1.Proxy
		facts  buildFacts
		action buildAction
		why    string // part of
		record recorded
		sync   bool
		cond   wantCondition
		events []wantEvent
	}{
		// As built: kept, up to date, the snapshot made again if lost.
		{"up to date", verdictProxy(), running, buildKeep, "", same, true, upToDateCond, nil},
		{"up to date after being outdated: no Event", verdictProxy(outdatedAs(v1alpha1.ReasonRenderingChanged)), running, buildKeep, "", same, true, upToDateCond, nil},
		{"up to date, booting", verdictProxy(), facts("", false, provider.StatePending), buildKeep, "", same, true, upToDateCond, nil},
		{"up to date, stopped: restarted", verdictProxy(), facts("", false, provider.StateStopped), buildRestart, "", same, true, upToDateCond, nil},
		{"up to date, state unknown: restarted", verdictProxy(), facts("", false, provider.StateUnknown), buildRestart, "", same, true, upToDateCond, nil},

		// Built before the intent hash was recorded (no rendered hash): adopted.
		{"legacy, this rendering", verdictProxy(recordedHashes(vRendered, "")), running, buildKeep, "",
			same, true, upToDateCond, []wantEvent{adoptedMatching}},
		{"legacy, another rendering, standalone", verdictProxy(recordedHashes(vOtherRender, "")), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, true, standaloneOld, []wantEvent{adoptedOther, renderingEvent}},
		{"legacy, another rendering, pool child", verdictProxy(recordedHashes(vOtherRender, ""), poolChild), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, true, childOld, []wantEvent{adoptedOther, renderingEvent}},
		{"legacy with a replace annotation: seen, not acted on", verdictProxy(recordedHashes(vRendered, ""), annotated("7", "")), running, buildKeep, "",
			recorded{vIntent, vRendered, "7"}, true, upToDateCond, []wantEvent{adoptedMatching}},
		{"legacy, stopped: restarted", verdictProxy(recordedHashes(vRendered, "")), facts("", false, provider.StateStopped), buildRestart, "",
			same, true, upToDateCond, []wantEvent{adoptedMatching}},

		// An intent hash over part of spec.proxy, by an earlier version, that matches the spec.
		{"partial intent, this rendering: adopted", verdictProxy(recordedHashes(vPartial, vRendered)), facts(vPartial, false, provider.StateRunning), buildKeep, "",
			same, true, upToDateCond, []wantEvent{adoptedPartial}},
		{"partial intent, another rendering, standalone: replaced", verdictProxy(recordedHashes(vPartial, vOtherRender)), facts(vPartial, false, provider.StateRunning), buildReplace,
			"allowedDestinations or allowOpenProxy may have been edited under an earlier operator version", recorded{vPartial, vOtherRender, ""}, false, wantCondition{}, nil},
		{"partial intent, another rendering, pool child: adopted, outdated", verdictProxy(recordedHashes(vPartial, vOtherRender), poolChild), facts(vPartial, false, provider.StateRunning), buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, childOld, []wantEvent{adoptedPartial, renderingEvent}},
		{"partial intent not matching: spec changed", verdictProxy(recordedHashes(vOlder, vRendered)), facts(vPartial, false, provider.StateRunning), buildReplace,
			"spec changed", recorded{vOlder, vRendered, ""}, false, wantCondition{}, nil},
		{"no partial intent read, empty spec hash: spec changed", verdictProxy(recordedHashes("", vRendered)), running, buildReplace,
			"spec changed", recorded{"", vRendered, ""}, false, wantCondition{}, nil},

		// A new intent.
		{"spec changed, standalone", verdictProxy(recordedHashes(vOlder, vRendered)), facts(vPartial, false, provider.StateRunning), buildReplace,
			"spec changed", recorded{vOlder, vRendered, ""}, false, wantCondition{}, nil},
		{"credentials changed, standalone: replaced", verdictProxy(recordedHashes(vOlder, vRendered)), facts(vPartial, true, provider.StateRunning), buildReplace,
			"spec changed", recorded{vOlder, vRendered, ""}, false, wantCondition{}, nil},
		{"spec changed, pool child", verdictProxy(recordedHashes(vOlder, vRendered), poolChild), facts(vPartial, false, provider.StateRunning), buildReplace,
			"spec changed", recorded{vOlder, vRendered, ""}, false, wantCondition{}, nil},
		{"credentials changed, pool child: kept for its pool", verdictProxy(recordedHashes(vOlder, vRendered), poolChild), facts(vPartial, true, provider.StateRunning), buildKeep, "",
			recorded{vOlder, vRendered, ""}, false, credsOld, []wantEvent{credsEvent}},
		{"credentials changed, pool child, already shown: no Event", verdictProxy(recordedHashes(vOlder, vRendered), poolChild, outdatedAs(v1alpha1.ReasonCredentialsChanged)),
			facts(vPartial, true, provider.StateRunning), buildKeep, "", recorded{vOlder, vRendered, ""}, false, credsOld, nil},
		{"credentials changed, pool child, a new replace annotation: not seen", verdictProxy(recordedHashes(vOlder, vRendered), poolChild, annotated("7", "")),
			facts(vPartial, true, provider.StateRunning), buildKeep, "", recorded{vOlder, vRendered, ""}, false, credsOld, []wantEvent{credsEvent}},
		{"credentials changed, pool child, stopped: restarted", verdictProxy(recordedHashes(vOlder, vRendered), poolChild), facts(vPartial, true, provider.StateStopped), buildRestart, "",
			recorded{vOlder, vRendered, ""}, false, credsOld, []wantEvent{credsEvent}},
		{"spec changed, stopped: replaced, not restarted", verdictProxy(recordedHashes(vOlder, vRendered)), facts(vPartial, false, provider.StateStopped), buildReplace,
			"spec changed", recorded{vOlder, vRendered, ""}, false, wantCondition{}, nil},

		// The replace annotation.
		{"new replace annotation, standalone", verdictProxy(annotated("7", "6")), running, buildReplace,
			`replacement asked for by annotation ` + v1alpha1.ReplaceAnnotation + `="7"`, recorded{vIntent, vRendered, "6"}, false, wantCondition{}, nil},
		{"replace annotation already acted on", verdictProxy(annotated("7", "7")), running, buildKeep, "",
			recorded{vIntent, vRendered, "7"}, true, upToDateCond, nil},
		{"new replace annotation, pool child: ignored", verdictProxy(annotated("7", "6"), poolChild), running, buildKeep, "",
			recorded{vIntent, vRendered, "7"}, true, upToDateCond, []wantEvent{ignoredEvent}},
		{"new replace annotation, pool child of another rendering", verdictProxy(annotated("7", ""), poolChild, recordedHashes(vIntent, vOtherRender)), running, buildKeep, "",
			recorded{vIntent, vOtherRender, "7"}, false, childOld, []wantEvent{ignoredEvent, renderingEvent}},
		{"new replace annotation, standalone of another rendering", verdictProxy(annotated("7", ""), recordedHashes(vIntent, vOtherRender)), running, buildReplace,
			"replacement asked for by annotation", recorded{vIntent, vOtherRender, ""}, false, wantCondition{}, nil},

		// A new rendering alone (an operator upgrade).
		{"rendering changed, standalone", verdictProxy(recordedHashes(vIntent, vOtherRender)), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, standaloneOld, []wantEvent{renderingEvent}},
		{"rendering changed, pool child", verdictProxy(recordedHashes(vIntent, vOtherRender), poolChild), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, childOld, []wantEvent{renderingEvent}},
		{"rendering changed, already shown: no Event", verdictProxy(recordedHashes(vIntent, vOtherRender), outdatedAs(v1alpha1.ReasonRenderingChanged)), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, standaloneOld, nil},
		{"rendering changed, shown for the credentials before: Event", verdictProxy(recordedHashes(vIntent, vOtherRender), outdatedAs(v1alpha1.ReasonCredentialsChanged)), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, standaloneOld, []wantEvent{renderingEvent}},
		{"rendering changed, no condition yet: Event", verdictProxy(recordedHashes(vIntent, vOtherRender), func(px *v1alpha1.Proxy) { px.Status.Conditions = nil }), running, buildKeep, "",
			recorded{vIntent, vOtherRender, ""}, false, standaloneOld, []wantEvent{renderingEvent}},
		{"rendering changed, stopped: restarted as built", verdictProxy(recordedHashes(vIntent, vOtherRender)), facts("", false, provider.StateStopped), buildRestart, "",
			recorded{vIntent, vOtherRender, ""}, false, standaloneOld, []wantEvent{renderingEvent}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := c.px.DeepCopy()
			v := judgeBuild(c.px, c.facts)
			if !reflect.DeepEqual(c.px, before) {
				t.Errorf("judgeBuild changed the Proxy: %+v, was %+v", c.px, before)
			}
			if v.action != c.action || !strings.Contains(v.why, c.why) || (c.why == "") != (v.why == "") {
				t.Errorf("action %s (%q), want %s (%q)", v.action, v.why, c.action, c.why)
			}
			if v.record != c.record {
				t.Errorf("records %+v, want %+v", v.record, c.record)
			}
			if v.syncSnapshot != c.sync {
				t.Errorf("syncs the snapshot: %v, want %v", v.syncSnapshot, c.sync)
			}
			checkVerdictCondition(t, c.px, v.condition, c.cond)
			checkVerdictEvents(t, v.events, c.events)
		})
	}
}

func checkVerdictCondition(t *testing.T, px *v1alpha1.Proxy, got *metav1.Condition, want wantCondition) {
	t.Helper()
	switch {
	case want == (wantCondition{}) && got != nil:
		t.Errorf("sets ConfigOutdated %+v, want none", *got)
	case want == (wantCondition{}):
	case got == nil:
		t.Errorf("sets no ConfigOutdated, want %s %s", want.status, want.reason)
	case got.Type != v1alpha1.ConditionConfigOutdated || got.Status != want.status || got.Reason != want.reason ||
		!strings.Contains(got.Message, want.message) || got.ObservedGeneration != px.Generation:
		t.Errorf("sets %+v, want ConfigOutdated=%s %s of generation %d with a message containing %q", *got, want.status, want.reason, px.Generation, want.message)
	}
}

func checkVerdictEvents(t *testing.T, got []verdictEvent, want []wantEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("records Events %+v, want %d: %+v", got, len(want), want)
		return
	}
	for i, w := range want {
		if g := got[i]; g.typ != w.typ || g.reason != w.reason || !strings.Contains(g.message, w.message) {
			t.Errorf("Event %d is %s %s %q, want %s %s containing %q", i, g.typ, g.reason, g.message, w.typ, w.reason, w.message)
		}
	}
}

// The provider's answer to a Get of the Proxy's instance: gone (created again, with the
// Event saying why, and a preempted one's condition and zone) or not (judged, or an error).
func TestBuildVerdictGone(t *testing.T) {
	reclaimed := provider.Preempted(errors.New("spot VM reclaimed at 16:20"))
	for _, c := range []struct {
		name      string
		zone      string
		err       error
		gone      bool
		event     wantEvent
		preempted bool // sets the Preempted condition
		wantZone  string
	}{
		{"there", "b", nil, false, wantEvent{}, false, ""},
		{"a failed Get", "b", provider.Transient(errors.New("timeout")), false, wantEvent{}, false, ""},
		{"gone", "b", fmt.Errorf("getting vm-7: %w", provider.ErrNotFound), true,
			wantEvent{corev1.EventTypeWarning, EventInstanceGone, "instance vm-7 is gone from provider home; creating it again"}, false, ""},
		{"preempted", "b", reclaimed, true,
			wantEvent{corev1.EventTypeWarning, v1alpha1.ReasonPreempted, "spot VM reclaimed at 16:20; building its successor proxy-"}, true, "b"},
		{"preempted without a zone", "", reclaimed, true,
			wantEvent{corev1.EventTypeWarning, v1alpha1.ReasonPreempted, "spot VM reclaimed at 16:20"}, true, "unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			px := verdictProxy(func(px *v1alpha1.Proxy) { px.Spec.Placement.Zone, px.Status.ProviderID = c.zone, "vm-7" })
			before := px.DeepCopy()
			v, gone := judgeGone(px, c.err)
			if !reflect.DeepEqual(px, before) {
				t.Errorf("judgeGone changed the Proxy")
			}
			if gone != c.gone {
				t.Fatalf("gone %v, want %v", gone, c.gone)
			}
			if !gone {
				return
			}
			checkVerdictEvents(t, []verdictEvent{v.event}, []wantEvent{c.event})
			switch p := v.preempted; {
			case !c.preempted && p != nil:
				t.Errorf("sets Preempted %+v, want none", *p)
			case !c.preempted:
			case p == nil:
				t.Errorf("sets no Preempted condition, want one")
			case p.Type != v1alpha1.ConditionPreempted || p.Status != metav1.ConditionTrue || p.Reason != v1alpha1.ReasonPreempted ||
				p.Message != v.event.message+"; this condition stays until the successor is Ready" || p.ObservedGeneration != px.Generation:
				t.Errorf("sets %+v, want Preempted=True Preempted with the Event's message and what it waits for", *p)
			}
			if v.zone != c.wantZone {
				t.Errorf("counted in zone %q, want %q", v.zone, c.wantZone)
			}
		})
	}
}
