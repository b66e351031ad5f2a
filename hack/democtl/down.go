package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// deleteAll records and deletes every Proxy of the cluster, in all namespaces. With a
// managerPid (the manager is running, so their finalizers are released as their VMs go)
// it follows them until none is left, printing what is left whenever that changes, and
// fails naming the Proxies still there when timeout passes or the manager exits.
func deleteAll(ctx context.Context, c client.Client, recordPath string, managerPid int, timeout, poll time.Duration, out io.Writer) error {
	items, err := recordProxies(ctx, c, recordPath)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		fmt.Fprintln(out, "no Proxy in the cluster")
		return nil
	}
	for i := range items {
		if err := c.Delete(ctx, &items[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting proxy %s/%s: %w", items[i].Namespace, items[i].Name, err)
		}
	}
	fmt.Fprintf(out, "deleting %d Proxies: %s\n", len(items), proxyNames(items))
	if managerPid == 0 {
		fmt.Fprintln(out, "the manager is not running: their finalizers stay until their domains are removed directly")
		return nil
	}
	start := time.Now()
	last := ""
	for {
		var list v1alpha1.ProxyList
		err := c.List(ctx, &list)
		if err == nil && len(list.Items) == 0 {
			fmt.Fprintf(out, "deleted %d Proxies, their VMs with them, in %s\n", len(items), time.Since(start).Round(time.Second))
			return nil
		}
		line := fmt.Sprint(err)
		if err == nil {
			line = fmt.Sprintf("%d left: %s", len(list.Items), describeLeft(list.Items))
		}
		if line != last {
			fmt.Fprintf(out, "  [%4ds] %s\n", int(time.Since(start).Seconds()), line)
			last = line
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("after %s, of the %d Proxies deleted %s", timeout, len(items), line)
		}
		if processGone(managerPid) {
			return fmt.Errorf("the manager (pid %d) is not running any more; of the %d Proxies deleted %s", managerPid, len(items), line)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the Proxies to go: %w", ctx.Err())
		case <-time.After(poll):
		}
	}
}

// describeLeft names each Proxy with its phase and what its status says, the reason a
// user wants to read when it does not go.
// processGone reports whether pid is no longer a running process: it does not exist, or it
// is a zombie nobody has reaped yet (to kill -0 that still looks alive).
func processGone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the last ")".
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

func describeLeft(items []v1alpha1.Proxy) string {
	parts := make([]string, 0, len(items))
	for i := range items {
		px := &items[i]
		msg := px.Status.Message
		if cond := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); cond != nil && msg == "" {
			msg = cond.Message
		}
		parts = append(parts, fmt.Sprintf("%s/%s (%s, instance %s: %s)", px.Namespace, px.Name, px.Status.Phase, px.InstanceName(), msg))
	}
	return strings.Join(parts, "; ")
}

func proxyNames(items []v1alpha1.Proxy) string {
	names := make([]string, 0, len(items))
	for i := range items {
		names = append(names, items[i].Namespace+"/"+items[i].Name)
	}
	return strings.Join(names, ", ")
}

// sweeper removes what is left of the demo's Proxies on the libvirt host once the
// manager is stopped.
type sweeper struct {
	prov provider.Provider
	// c is the demo's API server, nil when it does not answer.
	c      client.Client
	record string
	// pools maps a host's name to its storage pool, for the commands printed when a
	// domain cannot be removed.
	pools map[string]string
	out   io.Writer
}

// sweep removes, with the provider's own Delete (domain, volumes and NVRAM; a domain
// without the provider's mark is left alone), every domain that carries the provider's
// mark with the UID of a recorded Proxy, and nothing else: the libvirt host is shared, and
// a UID is what makes a domain this demo's. With the API server up it then releases the
// finalizers of the recorded Proxies whose domains are gone, so those Proxies go too. It
// fails naming every domain left, with the commands that remove it by hand; when none is
// left the record is removed, so a second sweep finds nothing to do.
func (s *sweeper) sweep(ctx context.Context) error {
	unlock, err := lockRecord(s.record)
	if err != nil {
		return err
	}
	defer unlock()
	r, err := loadRecord(s.record)
	if err != nil {
		return err
	}
	if len(r.Proxies) == 0 {
		fmt.Fprintln(s.out, "no Proxy recorded: nothing of this demo's to look for on the libvirt host")
		return nil
	}
	mine, err := s.demoDomains(ctx, r)
	if err != nil {
		return fmt.Errorf("%w; the recorded instances: %s", err, recordedInstances(r))
	}
	var failures []error
	removed := 0
	for _, inst := range mine {
		if err := s.prov.Delete(ctx, inst.ProviderID); err != nil {
			failures = append(failures, fmt.Errorf("deleting domain %s: %w", inst.ProviderID, err))
			continue
		}
		removed++
		fmt.Fprintf(s.out, "removed domain %s (Proxy %s) directly\n", inst.ProviderID, owner(r, inst.UID))
	}
	left, err := s.demoDomains(ctx, r)
	if err != nil {
		return errors.Join(append(failures, fmt.Errorf("checking what is left: %w", err))...)
	}
	if err := s.releaseFinalizers(ctx, r, left); err != nil {
		failures = append(failures, err)
	}
	if len(left) > 0 {
		lines := make([]string, 0, len(left))
		for _, inst := range left {
			lines = append(lines, fmt.Sprintf("%s (Proxy %s, uid %s)\n%s", inst.ProviderID, owner(r, inst.UID), inst.UID, s.removeCommands(inst)))
		}
		failures = append(failures, fmt.Errorf("%d domains of this demo are left on the libvirt host:\n%s", len(left), strings.Join(lines, "\n")))
		return errors.Join(failures...)
	}
	if removed == 0 {
		fmt.Fprintf(s.out, "none of the %d recorded Proxies has a domain left on the libvirt host\n", len(r.Proxies))
	} else {
		fmt.Fprintf(s.out, "removed %d domains directly; none of the %d recorded Proxies has a domain left on the libvirt host\n", removed, len(r.Proxies))
	}
	if err := errors.Join(failures...); err != nil {
		return err
	}
	if err := os.Remove(s.record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the record %s: %w", s.record, err)
	}
	return nil
}

// demoDomains lists the provider's marked instances whose UID the record holds.
func (s *sweeper) demoDomains(ctx context.Context, r *record) ([]provider.Instance, error) {
	all, err := s.prov.ListByTag(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the marked domains on the libvirt host: %w", err)
	}
	return slices.DeleteFunc(all, func(inst provider.Instance) bool { return inst.UID == "" || !r.has(inst.UID) }), nil
}

// releaseFinalizers removes the finalizer from each recorded Proxy that is being deleted
// and whose domain is not in left. Without an API server there is nothing to release.
func (s *sweeper) releaseFinalizers(ctx context.Context, r *record, left []provider.Instance) error {
	if s.c == nil {
		return nil
	}
	var list v1alpha1.ProxyList
	if err := s.c.List(ctx, &list); err != nil {
		fmt.Fprintf(s.out, "the API server does not answer (%v): the Proxies' objects stay, their domains are what counts\n", err)
		return nil
	}
	released := 0
	for i := range list.Items {
		px := &list.Items[i]
		uid := string(px.UID)
		if !r.has(uid) || px.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(px, proxy.Finalizer) ||
			slices.ContainsFunc(left, func(inst provider.Instance) bool { return inst.UID == uid }) {
			continue
		}
		orig := px.DeepCopy()
		controllerutil.RemoveFinalizer(px, proxy.Finalizer)
		if err := s.c.Patch(ctx, px, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing the finalizer of proxy %s/%s: %w", px.Namespace, px.Name, err)
		}
		released++
	}
	if released > 0 {
		fmt.Fprintf(s.out, "released the finalizers of %d Proxies whose domains are gone\n", released)
	}
	return nil
}

// removeCommands are the commands that remove inst by hand, as the provider's Delete
// would: the domain with its NVRAM, then its overlay and seed volumes.
func (s *sweeper) removeCommands(inst provider.Instance) string {
	host, pool := "", "POOL"
	if parts := strings.Split(inst.ProviderID, "/"); len(parts) == 4 {
		host = parts[1]
	}
	if p := s.pools[host]; p != "" {
		pool = p
	}
	v := "virsh -c qemu:///system"
	return fmt.Sprintf("  on host %s:\n    %s destroy %s\n    %s undefine --nvram %s\n    %s vol-delete --pool %s %s.qcow2\n    %s vol-delete --pool %s %s-seed.iso",
		host, v, inst.Name, v, inst.Name, v, pool, inst.Name, v, pool, inst.Name)
}

// owner names the recorded Proxy with that UID.
func owner(r *record, uid string) string {
	for _, p := range r.Proxies {
		if p.UID == uid {
			return p.Namespace + "/" + p.Name
		}
	}
	return "?"
}

func recordedInstances(r *record) string {
	parts := make([]string, 0, len(r.Proxies))
	for _, p := range r.Proxies {
		parts = append(parts, fmt.Sprintf("%s (Proxy %s/%s, uid %s)", p.Instance, p.Namespace, p.Name, p.UID))
	}
	return strings.Join(parts, ", ")
}
