package gce

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// The children of a ProxyPool share one firewall rule per (pool, source ranges, port)
// instead of one each, so that a pool of N uses one rule of the project's quota. The
// rule is named poolRulePrefix plus a digest of the provider entry, the install, the
// pool's UID, the sorted ranges and the port; it targets the network tag of that name,
// which every child it admits carries, and each such child carries the rule's name in
// its LabelPoolRule label. The rule is referenced by those instances and counted by
// listing them: it is made (or adopted, or put right) before a child is inserted, and
// deleted once no instance of this install carries its label.

// LabelPoolRule names, on a pool child's instance, the shared firewall rule admitting it.
const LabelPoolRule = "epo-fw"

// poolRulePrefix starts the name of every shared rule; no instance name starts with it.
const poolRulePrefix = "epo-pool-"

// poolRule is the shared rule a pool child of req is admitted by: its name and ranges.
func (p *Provider) poolRule(req provider.CreateRequest, ranges []string) string {
	sorted := slices.Clone(ranges)
	slices.Sort(sorted)
	sum := sha256.Sum256([]byte(strings.Join([]string{p.name, p.installID, req.Pool.UID, strings.Join(sorted, ","), fmt.Sprint(req.Port)}, "\x00")))
	return poolRulePrefix + hex.EncodeToString(sum[:8])
}

// isPoolRule says whether name is a shared rule's (not an instance's).
func isPoolRule(name string) bool { return strings.HasPrefix(name, poolRulePrefix) }

// poolRuleLock is the lock of one shared rule: Creates inserting a child admitted by it
// hold it shared from the rule's check to the insert's end, the release that may delete
// it holds it alone from its count to the delete, so that a rule is never deleted under a
// child being inserted (the manager's reconcilers run in one process, the leader).
func (p *Provider) poolRuleLock(name string) *sync.RWMutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ruleLocks == nil {
		p.ruleLocks = map[string]*sync.RWMutex{}
	}
	l, ok := p.ruleLocks[name]
	if !ok {
		l = &sync.RWMutex{}
		p.ruleLocks[name] = l
	}
	return l
}

// poolRuleDescription marks a shared rule as this provider's and install's, made for the
// children of pool.
func (p *Provider) poolRuleDescription(pool provider.PoolRef) string {
	return fmt.Sprintf("%s provider=%s install=%s pool=%s/%s uid=%s", firewallMark, ident.LabelValue(p.name), ident.LabelValue(p.installID), pool.Namespace, pool.Name, pool.UID)
}

// ensurePoolRule makes sure the shared rule name admits port from ranges to the
// network tag tag (the shared rule's own name; its IPv6 rule targets the same tag): it
// is inserted when missing, left as it is when it matches, and patched back to what it
// must be when it is this install's but differs (edited by hand). A rule of that name
// that is not this install's is a permanent error, never touched.
func (p *Provider) ensurePoolRule(ctx context.Context, c *clients, req provider.CreateRequest, name, tag string, ranges []string) error {
	var fw *computepb.Firewall
	err := p.call(ctx, "firewalls.get", target{firewall: name}, func(ctx context.Context) (err error) {
		fw, err = c.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: p.cfg.Project, Firewall: name})
		return err
	})
	want := &computepb.Firewall{
		Name: proto.String(name), Network: proto.String(p.cfg.Network), Description: proto.String(p.poolRuleDescription(req.Pool)),
		Direction: proto.String("INGRESS"), SourceRanges: ranges, TargetTags: []string{tag},
		Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{fmt.Sprint(req.Port)}}},
	}
	switch {
	case err == nil && !p.ownsFirewall(fw):
		return p.notOurRule(fw)
	case err == nil && poolRuleMatches(fw, want):
		return nil
	case err == nil:
		return p.patchPoolRule(ctx, c, want)
	case !isNotFound(err):
		return notNotFound(classify(err, "reading firewall rule "+name))
	}
	key := "firewall/" + name
	rid := requestID(p.failures(key), "firewall", p.cfg.Project, name, req.Pool.UID)
	err = p.insertRule(ctx, c, key, rid, want)
	if errors.Is(err, errAlreadyExists) {
		// Made meanwhile by a sibling's Create: judged as any rule found.
		return p.ensurePoolRule(ctx, c, req, name, tag, ranges)
	}
	return err
}

// poolRuleMatches says whether fw is want in what it admits, to what and for whom.
func poolRuleMatches(fw, want *computepb.Firewall) bool {
	have := slices.Clone(fw.GetSourceRanges())
	slices.Sort(have)
	wantRanges := slices.Clone(want.GetSourceRanges())
	slices.Sort(wantRanges)
	allowed := fw.GetAllowed()
	return slices.Equal(have, wantRanges) && slices.Equal(fw.GetTargetTags(), want.GetTargetTags()) &&
		fw.GetDescription() == want.GetDescription() && fw.GetDirection() == "INGRESS" && !fw.GetDisabled() &&
		len(allowed) == 1 && allowed[0].GetIPProtocol() == "tcp" && slices.Equal(allowed[0].GetPorts(), want.GetAllowed()[0].GetPorts())
}

// patchPoolRule puts a shared rule back to want in place, so that the children it
// already admits are never cut off as a delete and insert would.
func (p *Provider) patchPoolRule(ctx context.Context, c *clients, want *computepb.Firewall) error {
	name := want.GetName()
	what := "patching firewall rule " + name
	var op *compute.Operation
	err := p.call(ctx, "firewalls.patch", target{firewall: name}, func(ctx context.Context) (err error) {
		patch := proto.CloneOf(want)
		patch.Disabled = proto.Bool(false)
		op, err = c.firewalls.Patch(ctx, &computepb.PatchFirewallRequest{Project: p.cfg.Project, Firewall: name, FirewallResource: patch})
		return err
	})
	if err != nil {
		return notNotFound(classify(err, what))
	}
	return notNotFound(p.wait(ctx, op, "globalOperations.get", target{firewall: name}, what))
}

// poolRuleUsers lists the names of this install's instances carrying the shared rule
// name in their LabelPoolRule label; any failed page fails the listing.
func (p *Provider) poolRuleUsers(ctx context.Context, c *clients, name string) ([]string, error) {
	var out []string
	err := p.call(ctx, "instances.aggregatedList", target{firewall: name}, func(ctx context.Context) error {
		out = nil
		it := c.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
			Project: p.cfg.Project, Filter: proto.String(p.listFilter() + fmt.Sprintf(` AND (labels.%s = "%s")`, LabelPoolRule, name)),
		})
		for {
			pair, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			if err != nil {
				return err
			}
			for _, inst := range pair.Value.GetInstances() {
				if p.owner(inst) == ownedHere && inst.GetLabels()[LabelPoolRule] == name {
					out = append(out, inst.GetName())
				}
			}
		}
	})
	if err != nil {
		return nil, notNotFound(classify(err, "listing the instances admitted by firewall rule "+name))
	}
	return out, nil
}

// releasePoolRule deletes the shared rule name when no instance of this install carries
// it any more (the one just deleted, gone, excepted). inUse says what to do when one
// still does: nil leaves the rule (a child's Delete), an error reports it (orphan GC's
// Delete of the rule itself, which a child inserted meanwhile made stale).
func (p *Provider) releasePoolRule(ctx context.Context, c *clients, name, deleted string, inUse func(users []string) error) error {
	l := p.poolRuleLock(name)
	l.Lock()
	defer l.Unlock()
	users, err := p.poolRuleUsers(ctx, c, name)
	if err != nil {
		return err
	}
	users = slices.DeleteFunc(users, func(u string) bool { return u == deleted })
	if len(users) > 0 {
		return inUse(users)
	}
	return p.deleteRules(ctx, c, name)
}
