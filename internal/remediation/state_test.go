package remediation

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// proxy is a Managed Proxy on kvm2's host beelink whose instance started running at
// started (zero: not running), with the Healthy condition given (nil: never probed).
func proxy(started time.Time, healthy *metav1.Condition, latency int64) *v1alpha1.Proxy {
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a"},
		Spec:       v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Provider: "kvm2", Placement: v1alpha1.ProxyPlacement{Zone: "beelink"}, Port: 3128},
		Status:     v1alpha1.ProxyStatus{ProviderID: "kvm2://beelink/proxy-1", IP: "192.0.2.7", ProbeLatencyMilliseconds: latency},
	}
	px.Status.ProbeTarget = px.CurrentProbeTarget()
	if !started.IsZero() {
		px.Status.Conditions = append(px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionProvisioned,
			Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonInstanceRunning, LastTransitionTime: metav1.NewTime(started)})
	}
	if healthy != nil {
		healthy.Type = v1alpha1.ConditionHealthy
		px.Status.Conditions = append(px.Status.Conditions, *healthy)
		px.Status.Healthy = healthy.Status == metav1.ConditionTrue
	}
	return px
}

func cond(status metav1.ConditionStatus, reason string, at time.Time) *metav1.Condition {
	return &metav1.Condition{Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(at)}
}

func TestFromProxy(t *testing.T) {
	started := at(time.Hour)
	for _, tc := range []struct {
		name string
		px   *v1alpha1.Proxy
		want State
	}{
		{name: "booting, never probed", px: proxy(started, nil, 0),
			want: State{Started: started}},
		{name: "never answered: False at the first failure, no latency",
			px:   proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, started.Add(time.Minute)), 0),
			want: State{Started: started}},
		{name: "healthy", px: proxy(started, cond(metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, started.Add(2*time.Minute)), 40),
			want: State{Started: started, Answered: true, Healthy: true, HealthySince: started.Add(2 * time.Minute)}},
		{name: "answered, then failing",
			px:   proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, started.Add(time.Hour)), 40),
			want: State{Started: started, Answered: true, FailingSince: started.Add(time.Hour)}},
		{name: "a new instance: the old one's health cleared before it started, its latency left",
			px:   proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, started.Add(-time.Minute)), 40),
			want: State{Started: started}},
		{name: "healthy about another instance", px: func() *v1alpha1.Proxy {
			px := proxy(started, cond(metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, started.Add(-time.Hour)), 40)
			px.Status.ProbeTarget = "kvm2://beelink/proxy-0 192.0.2.7:3128"
			return px
		}(), want: State{Started: started}},
		{name: "address lost after its probes failed: failing since they did",
			px:   lostAddress(proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, started.Add(time.Hour)), 40), started.Add(61*time.Minute)),
			want: State{Started: started, Answered: true, FailingSince: started.Add(time.Hour)}},
		{name: "address lost before its probes failed (never probed since): failing since Ready fell",
			px:   lostAddress(proxy(started, cond(metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, started.Add(time.Minute)), 40), started.Add(2*time.Hour)),
			want: State{Started: started, Answered: true, FailingSince: started.Add(2 * time.Hour)}},
		{name: "address lost, never answered on this instance: booting still", px: func() *v1alpha1.Proxy {
			px := lostAddress(proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, started.Add(time.Minute)), 40), started.Add(2*time.Minute))
			px.Status.ProbeTarget = "kvm2://beelink/proxy-0 192.0.2.7:3128"
			return px
		}(), want: State{Started: started}},
		{name: "not running", px: func() *v1alpha1.Proxy {
			px := proxy(time.Time{}, cond(metav1.ConditionFalse, "NotProbed", started), 40)
			px.Status.Conditions = append(px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionProvisioned,
				Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProvisioning, LastTransitionTime: metav1.NewTime(started)})
			return px
		}(), want: State{}},
		{name: "a pool child", px: func() *v1alpha1.Proxy {
			px := proxy(started, nil, 0)
			px.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "news", Controller: new(true)}}
			return px
		}(), want: State{Group: "pool/default/news", Started: started}},
		{name: "external", px: func() *v1alpha1.Proxy {
			px := proxy(time.Time{}, nil, 0)
			px.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.7"}
			return px
		}(), want: State{Group: ExternalGroup, NotRemediable: notRemediableExternal}},
		{name: "being deleted", px: func() *v1alpha1.Proxy {
			px := proxy(started, nil, 0)
			px.DeletionTimestamp = &metav1.Time{Time: started}
			return px
		}(), want: State{Started: started, NotRemediable: notRemediableDeleting}},
		{name: "failed", px: func() *v1alpha1.Proxy {
			px := proxy(started, nil, 0)
			px.Status.Phase = v1alpha1.PhaseFailed
			return px
		}(), want: State{Started: started, NotRemediable: notRemediableFailed}},
		{name: "cordoned", px: func() *v1alpha1.Proxy {
			px := proxy(started, nil, 0)
			px.Annotations = map[string]string{v1alpha1.CordonAnnotation: "true"}
			return px
		}(), want: State{Started: started, NotRemediable: notRemediableCordoned}},
		{name: "leaving from the wrong address",
			px:   proxy(started, cond(metav1.ConditionFalse, v1alpha1.ReasonEgressMismatch, started.Add(time.Minute)), 40),
			want: State{Started: started, Answered: true, FailingSince: started.Add(time.Minute), NotRemediable: notRemediableEgress}},
		{name: "with a record", px: func() *v1alpha1.Proxy {
			px := proxy(started, nil, 0)
			px.Annotations = map[string]string{RecordAnnotation: Record{Reason: ReasonBootTimeout, Attempt: 1, Action: ActionReboot, At: at(2 * time.Hour), FaultSince: started}.Encode()}
			return px
		}(), want: State{Started: started, Record: &Record{Reason: ReasonBootTimeout, Attempt: 1, Action: ActionReboot, At: at(2 * time.Hour), FaultSince: started}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromProxy(tc.px)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.Key = "default/a"
			if tc.want.Group == "" {
				tc.want.Group = "provider/kvm2/beelink"
			}
			if (got.Record == nil) != (tc.want.Record == nil) || got.Record != nil && *got.Record != *tc.want.Record {
				t.Errorf("record %+v, want %+v", got.Record, tc.want.Record)
			}
			got.Record, tc.want.Record = nil, nil
			if got != tc.want {
				t.Errorf("FromProxy:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	px := proxy(started, nil, 0)
	px.Annotations = map[string]string{RecordAnnotation: "{"}
	st, err := FromProxy(px)
	if err == nil || !strings.Contains(err.Error(), RecordAnnotation) || st.Record != nil || !st.Started.Equal(started) {
		t.Errorf("a record that does not parse: %+v, %v; want the State without it and an error naming the annotation", st, err)
	}
}

func TestGroups(t *testing.T) {
	if g := HostGroup("gce", ""); g != "provider/gce" {
		t.Errorf("HostGroup(gce) = %s", g)
	}
	if g := HostGroup("kvm2", "nuc"); g != "provider/kvm2/nuc" {
		t.Errorf("HostGroup(kvm2, nuc) = %s", g)
	}
}

// lostAddress is px as the reconciler leaves a Proxy whose running instance stopped
// reporting its address at lost: Provisioned stays True (reason AddressLost, its
// transition kept), the address is gone, Ready is False since lost.
func lostAddress(px *v1alpha1.Proxy, lost time.Time) *v1alpha1.Proxy {
	for i := range px.Status.Conditions {
		if c := &px.Status.Conditions[i]; c.Type == v1alpha1.ConditionProvisioned {
			c.Reason = v1alpha1.ReasonAddressLost
		}
	}
	px.Status.IP = ""
	px.Status.Conditions = append(px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady,
		Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProvisioning, LastTransitionTime: metav1.NewTime(lost)})
	return px
}
