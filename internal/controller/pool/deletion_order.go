package pool

import (
	"fmt"
	"sort"
	"time"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
)

// Which child a pool deletes first, and what it says of it. The plan (planPool) decides
// how many children go and under which bounds; the candidates it takes, a scale down's
// excess or the stale children to replace, are taken in the order sortForDeletion gives,
// and act names each deletion's cause with deletionCause.

// deletionPriority ranks a child for deletion, higher first: cordoned or handed over by
// remediation, then Failed, then
// not Ready, then (for stale children) past the deadline or outdated, then the rest.
func deletionPriority(c *poolChild) int {
	switch {
	case c.cordoned, c.remediate:
		return 4
	case c.broken():
		return 3
	case !c.ready:
		return 2
	case !c.available:
		return 1
	default:
		return 0
	}
}

// sortForDeletion orders children most deletable first: by deletionPriority, then by
// order (Oldest: oldest first; Newest: newest first; Random: by a hash of the name and
// seed, stable for one seed), then by name.
func sortForDeletion(cs []*poolChild, order v1alpha1.PoolDeletionOrder, seed string) {
	sort.SliceStable(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if pa, pb := deletionPriority(a), deletionPriority(b); pa != pb {
			return pa > pb
		}
		switch order {
		case v1alpha1.DeletionOrderNewest:
			if !a.created.Equal(b.created) {
				return a.created.After(b.created)
			}
		case v1alpha1.DeletionOrderRandom:
			if ha, hb := unitHash(seed+"/"+a.name), unitHash(seed+"/"+b.name); ha != hb {
				return ha < hb
			}
		default: // Oldest
			if !a.created.Equal(b.created) {
				return a.created.Before(b.created)
			}
		}
		return a.name < b.name
	})
}

// deletionCause says in a few words why a child is deleted.
func deletionCause(c *poolChild, replicas int32, deadline time.Duration) string {
	switch {
	case c.cordoned:
		return "cordoned"
	case c.remediate:
		return "remediation: replaced as it did not become or stay healthy (annotation " + common.RemediationReplaceAnnotation + ")"
	case c.failed:
		return "failed"
	case c.stuck:
		return fmt.Sprintf("stuck: not Ready within progressDeadlineSeconds (%d) of its birth", int64(deadline/time.Second))
	case !c.upToDate:
		return "made from an older template or placement"
	case c.outdated:
		return "its configuration is outdated (ConfigOutdated)"
	case c.expired:
		return "past its rotation deadline"
	default:
		return fmt.Sprintf("scaling down to %d replicas", replicas)
	}
}
