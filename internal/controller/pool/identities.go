package pool

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
)

// A pool's egress identities: to the sites a crawler reaches, children that leave from
// one address are one proxy, however many VMs they are (a homelab's VMs behind one NAT
// address). The pool counts the distinct addresses its available children leave from and
// says which children share one.

// egressIdentities groups the available children by the egress address the health
// probe saw (status.egressIP), each group's names sorted; children whose address is not
// known yet are counted in unknown.
func (s *poolScope) egressIdentities() (byIP map[string][]string, unknown int) {
	byIP = map[string][]string{}
	for _, c := range s.children {
		px := c.px
		if !c.available {
			continue
		}
		ip := px.Status.EgressIP
		if ip == "" {
			unknown++
			continue
		}
		byIP[ip] = append(byIP[ip], px.Name)
	}
	for _, names := range byIP {
		slices.Sort(names)
	}
	return byIP, unknown
}

// setEgressIdentities sets status.distinctEgressIPs and the EgressShared condition.
func (s *poolScope) setEgressIdentities() {
	pool := s.pool
	byIP, unknown := s.egressIdentities()
	pool.Status.DistinctEgressIPs = int32(len(byIP))
	cond := metav1.Condition{Type: v1alpha1.PoolConditionEgressShared, ObservedGeneration: pool.Generation}
	if shared := sharedEgress(byIP); shared != "" {
		cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.PoolReasonSharedEgressIP
		cond.Message = fmt.Sprintf("available children share egress addresses, so sites see them as one proxy each: %s", shared)
	} else {
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs
		cond.Message = fmt.Sprintf("%d available children leave from %d distinct egress addresses", countNames(byIP), len(byIP))
	}
	if unknown > 0 {
		cond.Message += fmt.Sprintf("; %d more available children have no egress address known yet (the probe target did not report one)", unknown)
	}
	meta.SetStatusCondition(&pool.Status.Conditions, cond)
}

// sharedEgress names each address two or more children leave from, with those
// children, in address order: "198.51.100.7 (a, b); 198.51.100.9 (c, d, e)". At most
// common.MaxNamed addresses and common.MaxNamed children per address are named.
func sharedEgress(byIP map[string][]string) string {
	var parts []string
	ips := make([]string, 0, len(byIP))
	for ip, names := range byIP {
		if len(names) > 1 {
			ips = append(ips, ip)
		}
	}
	slices.Sort(ips)
	for i, ip := range ips {
		if i == common.MaxNamed {
			parts = append(parts, fmt.Sprintf("and %d more addresses", len(ips)-common.MaxNamed))
			break
		}
		names := byIP[ip]
		list := strings.Join(names[:min(len(names), common.MaxNamed)], ", ")
		if len(names) > common.MaxNamed {
			list += fmt.Sprintf(" and %d more", len(names)-common.MaxNamed)
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", ip, list))
	}
	return strings.Join(parts, "; ")
}

func countNames(byIP map[string][]string) int {
	n := 0
	for _, names := range byIP {
		n += len(names)
	}
	return n
}
