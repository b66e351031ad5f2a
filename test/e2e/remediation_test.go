//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// e2eUnhealthyTimeout is the lifecycle Proxy's spec.remediation.unhealthyTimeout: the
// shortest the API takes, so the mending below costs the tier a minute of waiting, not
// the default five.
const e2eUnhealthyTimeout = time.Minute

// bootID is the guest's boot id (through the guest agent), new on every boot.
func (s *story) bootID() string {
	s.t.Helper()
	out, code, err := s.host.GuestExec(s.vm, "/bin/cat", "/proc/sys/kernel/random/boot_id")
	if err != nil || code != 0 {
		s.t.Fatalf("reading the boot id of guest %s: exit %d: %v", s.vm, code, err)
	}
	return strings.TrimSpace(out)
}

// mendsBrokenNetwork breaks the Ready guest's network from inside (its en* links set
// down through the guest agent, as a guest whose network failed is left) and waits for
// the operator to mend it with nobody's help: the probes fail or the address is lost,
// and the Proxy leaves rotation; after spec.remediation.unhealthyTimeout it is rebooted (the same domain,
// reset: a new boot id, the same UUID), with a Warning Event Unhealthy and the
// Remediating condition; the guest boots, its network comes up again, and the Proxy is
// Ready. during runs once the Proxy is out of rotation (the other guest's check), so its
// time overlaps the unhealthy timeout and the reboot. It logs the time from the fault to
// each step.
func (s *story) mendsBrokenNetwork(ctx context.Context, during func()) {
	t := s.t
	before := s.mustProxy()
	if !framework.IsReady(before) {
		t.Fatalf("Proxy %s is not Ready before its network is broken:\n%s", s.key, s.describe())
	}
	uuid, boot := s.uuid(), s.bootID()
	fault := time.Now()
	// `ip link set down` on every en* link: the guest then neither answers nor sends on the
	// bridge. The guest agent talks over virtio-serial, which the fault does not touch.
	out, code, err := s.host.GuestExec(s.vm, "/bin/sh", "-c",
		`set -e; for l in /sys/class/net/en*; do ip link set "${l##*/}" down; done; ip -br link`)
	if err != nil || code != 0 {
		t.Fatalf("taking the guest's links down: exit %d %q: %v", code, out, err)
	}
	t.Logf("mending: links of guest %s taken down: %q", s.vm, strings.TrimSpace(out))

	// Out of rotation by whichever the operator sees first: failed probes (Healthy=False)
	// or, once the guest agent has reported no address for the address hold,
	// Provisioned=True AddressLost (no address left to probe). Either way it is not Ready.
	var why string
	s.waitProxy("the Proxy to be taken out of rotation (not Ready) after its network broke", shortDeadline, func(p *v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
		switch {
		case framework.IsReady(p):
			return false
		case c != nil && c.Reason == v1alpha1.ReasonAddressLost:
			why = "address lost: " + c.Message
		case meta.IsStatusConditionFalse(p.Status.Conditions, v1alpha1.ConditionHealthy):
			why = "probes failed: " + meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHealthy).Message
		default:
			why = "phase " + string(p.Status.Phase)
		}
		return true
	})
	unhealthy := time.Now()
	t.Logf("mending: out of rotation (%s)", why)
	if during != nil {
		during() // the reboot's record and Event stay, should it come meanwhile
	}
	var rec *remediation.Record
	s.waitProxy(fmt.Sprintf("a reboot after the unhealthy timeout (%s): attempt 1 in annotation %s", e2eUnhealthyTimeout, remediation.RecordAnnotation),
		shortDeadline+e2eUnhealthyTimeout, func(p *v1alpha1.Proxy) bool {
			rec, _ = remediation.ParseRecord(p.Annotations[remediation.RecordAnnotation])
			return rec != nil && rec.Attempt == 1 && rec.Action == remediation.ActionReboot
		})
	if rec.Reason != remediation.ReasonUnhealthy {
		t.Errorf("remediation record %+v: want reason %s", rec, remediation.ReasonUnhealthy)
	}
	s.waitEvent(corev1.EventTypeWarning, remediation.ReasonUnhealthy, string(remediation.ActionReboot))

	ready := s.waitBooted("the rebooted guest to serve again (phase Ready, healthy)", framework.IsReady)
	// The times are the operator's own (the record's attempt, the Ready condition's
	// transition), not when this test looked: the other guest's check may have run past
	// them. This machine's clock is the API server's.
	rebooted, readyAt := rec.At, time.Now()
	if c := meta.FindStatusCondition(ready.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == "True" {
		readyAt = c.LastTransitionTime.Time
	}
	if got := s.uuid(); got != uuid {
		t.Errorf("domain %s has UUID %s after the reboot, was %s: it was replaced, not rebooted", s.vm, got, uuid)
	}
	if got := s.bootID(); got == boot {
		t.Errorf("guest %s has boot id %s after the reboot, as before: it was not rebooted", s.vm, got)
	}
	if ready.Status.IP != before.Status.IP {
		t.Errorf("the rebooted guest has address %s, was %s: its lease should have stayed", ready.Status.IP, before.Status.IP)
	}
	if c := meta.FindStatusCondition(ready.Status.Conditions, remediation.ConditionRemediating); c != nil {
		t.Logf("mending: Remediating condition once Ready: %s %s: %s", c.Status, c.Reason, c.Message)
	}
	t.Logf("mending a broken guest network: fault -> out of rotation %s (seen by the test) -> reboot (attempt 1, %s; failing since %s) %s -> Ready %s; fault -> Ready %s",
		span(fault, unhealthy, time.Second), rec.Reason, rec.FaultSince.UTC().Format(time.TimeOnly), span(unhealthy, rebooted, time.Second),
		span(rebooted, readyAt, time.Second), span(fault, readyAt, time.Second))
}

// waitEvent waits for an Event of reason and action on the Proxy.
func (s *story) waitEvent(typ, reason, action string) {
	s.t.Helper()
	s.waitFor(fmt.Sprintf("a %s Event %s (action %s) on Proxy %s", typ, reason, action, s.key), shortDeadline, time.Second, func() (bool, error) {
		var evs eventsv1.EventList
		if err := s.c.List(context.Background(), &evs, client.InNamespace(s.key.Namespace)); err != nil {
			return false, err
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Regarding.Name != s.key.Name || ev.Regarding.Kind != "Proxy" {
				continue
			}
			if ev.Reason == reason && ev.Action == action && ev.Type == typ {
				s.t.Logf("mending: Event %s %s/%s: %s", ev.Type, ev.Reason, ev.Action, ev.Note)
				return true, nil
			}
			seen = append(seen, ev.Reason+"/"+ev.Action)
		}
		return false, fmt.Errorf("Events of the Proxy: %v", seen)
	})
}
