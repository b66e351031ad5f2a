package kvm2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
)

// DomainCreate is synchronous, so the first poll after it normally answers running; the
// wait only covers a hypervisor that reports the start late.
const (
	defaultRunningWait = 15 * time.Second
	defaultRunningPoll = 500 * time.Millisecond
)

// createPlan is a Create request resolved against the config.
type createPlan struct {
	req    provider.CreateRequest
	host   provider.KVMHost
	mtName string
	mt     provider.KVMMachineType
	img    imagecache.Image
}

// Create makes sure domain req.Name runs on the host placement.zone selects. It reads
// straight down: plan (placement checked against the config before any host is dialled),
// adoption of a domain of that name that already carries this provider's mark with
// req.UID (or no UID) and the same spec, then the image (the cached base, or the pending
// result of the background job fetching it), the volumes (overlay and a freshly built
// seed), define and start.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	plan, err := p.plan(req)
	if err != nil {
		return provider.Instance{}, err
	}
	log := p.instanceLog(ctx, plan.host.Name, req.Name)
	unlock, err := p.locks.lock(ctx, req.Name)
	if err != nil {
		return provider.Instance{}, provider.Transient(fmt.Errorf("waiting for the lock on domain %s: %w", req.Name, err))
	}
	defer unlock()
	b, err := p.hosts.pooled(ctx, plan.host.Name)
	if err == nil {
		var inst provider.Instance
		if inst, err = p.create(ctx, log, b, plan); err == nil {
			return inst, nil
		}
	}
	if errors.Is(err, provider.ErrPending) {
		return provider.Instance{}, err
	}
	err = failed(log, "create", err, classifyInCreate)
	if errors.Is(err, provider.ErrNotFound) {
		// A step classified elsewhere as NotFound; the contract forbids it from Create.
		return provider.Instance{}, provider.Transient(fmt.Errorf("creating domain %s on host %s: %s", req.Name, plan.host.Name, err.Error()))
	}
	return provider.Instance{}, err
}

// plan resolves placement: zone, then machine type, then image. Every miss is permanent.
func (p *Provider) plan(req provider.CreateRequest) (createPlan, error) {
	h, err := p.host(req.Placement.Zone)
	if err != nil {
		return createPlan{}, err
	}
	mt, ok := p.cfg.MachineTypes[req.Placement.MachineType]
	if !ok {
		return createPlan{}, provider.Errorf(provider.ErrPermanent,
			"placement.machineType %q is not in %s.machineTypes", req.Placement.MachineType, p.typ)
	}
	img, err := p.images.Plan(req.Placement.Image)
	if err != nil {
		return createPlan{}, err
	}
	if !ident.ValidName(req.Name) {
		return createPlan{}, provider.Errorf(provider.ErrPermanent,
			"instance name %q may hold only letters, digits, dots, dashes and underscores", req.Name)
	}
	return createPlan{req: req, host: h, mtName: req.Placement.MachineType, mt: mt, img: img}, nil
}

func (p *Provider) create(ctx context.Context, log logr.Logger, b backend, plan createPlan) (provider.Instance, error) {
	h, req := plan.host, plan.req
	if log.V(2).Enabled() {
		log.V(2).Info("kvm2 create resolved", "pool", h.Pool, "bridge", h.Bridge, "domainType", h.DomainType,
			"machineType", plan.mtName, "vcpus", plan.mt.VCPUs, "memoryMiB", plan.mt.MemoryMiB,
			"diskSizeGb", p.cfg.DiskSizeGb, "imageVolume", plan.img.BaseVol(), "firmware", plan.img.Firmware,
			"cloudInitBytes", len(req.CloudInit))
	}
	dom, err := b.DomainLookupByName(req.Name)
	found := err == nil
	if !found && !isCode(err, libvirt.ErrNoDomain) {
		return provider.Instance{}, fmt.Errorf("looking up domain %s on host %s: %w", req.Name, h.Name, err)
	}
	var m ident.Mark
	if found {
		log.V(1).Info("kvm2 domain already defined")
		if m, err = p.ownMark(b, plan, dom); err != nil {
			return provider.Instance{}, err
		}
		if !m.Building && !builtFromOtherSpec(m, req.SpecHash) {
			return p.adopt(ctx, log, b, plan, dom, m)
		}
	}
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("looking up pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	// The image first: while its job runs, the Create returns pending and touches nothing.
	base, err := p.images.Base(ctx, b, plan.host, pool, plan.img, plan.req.Name)
	if err != nil {
		return provider.Instance{}, err
	}
	switch {
	case found && m.Building:
		// Our own claim, left by an attempt that stopped before its disks were done.
		log.Info("kvm2 domain rebuilt: an earlier attempt stopped while building its disks", "specHash", req.SpecHash)
		if err := p.remove(log, b, h, dom); err != nil {
			return provider.Instance{}, err
		}
	case found:
		// Built from another spec, typically by an attempt whose start failed before the
		// reconciler recorded it: booting it would keep the old definition and seed.
		log.Info("kvm2 domain replaced: it was built from another spec", "oldSpecHash", m.SpecHash, "specHash", req.SpecHash)
		if err := p.remove(log, b, h, dom); err != nil {
			return provider.Instance{}, err
		}
	default:
		// Nothing here yet: the Proxy may have had a domain on another host before its
		// placement changed.
		if err := p.removeElsewhere(ctx, log, plan); err != nil {
			return provider.Instance{}, err
		}
	}
	created := p.now().UTC().Truncate(time.Second)
	own := ident.Mark{UID: req.UID, CreatedAt: created, Install: p.installID, SpecHash: req.SpecHash}
	claim, err := p.claimForCreate(log, b, plan, own)
	if err != nil {
		return provider.Instance{}, err
	}
	overlay, seed, err := p.volumes(log, b, plan, pool, base)
	if err != nil {
		return provider.Instance{}, err
	}
	meta, err := ident.MarshalMark(p.metaNS, own)
	if err != nil {
		return provider.Instance{}, provider.Permanent(err)
	}
	xml, err := buildDomainXML(domainSpec{
		Name: req.Name, UUID: formatUUID(claim.UUID), DomainType: h.DomainType, VCPUs: plan.mt.VCPUs,
		MemoryMiB: plan.mt.MemoryMiB, Firmware: plan.img.Firmware, OverlayPath: overlay, SeedPath: seed,
		Bridge: h.Bridge, Metadata: meta,
	})
	if err != nil {
		return provider.Instance{}, provider.Permanent(err)
	}
	dom, err = b.DomainDefineXMLFlags(xml, 0)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("defining domain %s on host %s: %w", req.Name, h.Name, err)
	}
	kv := []any{"uid", req.UID, "specHash", req.SpecHash, "firmware", plan.img.Firmware}
	if log.V(2).Enabled() {
		kv = append(kv, "xml", xml)
	}
	log.V(1).Info("domain defined", kv...)
	if err := p.start(ctx, log, b, h, dom); err != nil {
		return provider.Instance{}, err
	}
	return p.instance(h, dom, req.UID, created), nil
}

// claimForCreate claims the name for a Create whose mark is own: the claim carries it
// with building set, so a repeat Create of the same owner that finds it knows the disks
// may be incomplete. Only the holder of a name's claim (or of its finished domain)
// creates, writes or deletes the volumes of that name, so two installs creating the same
// name at once cannot touch each other's disks. A loser of the race reads the winner's
// mark and fails as checkAdoption says: another install's is permanent, another UID's
// is permanent and wraps provider.ErrOwnedByOther; its own install's and UID's (a
// second process of this install) is transient.
func (p *Provider) claimForCreate(log logr.Logger, b backend, plan createPlan, own ident.Mark) (libvirt.Domain, error) {
	h, req := plan.host, plan.req
	claim := own
	claim.Building = true
	dom, err := p.claim(b, h, req.Name, claim)
	if err == nil {
		log.V(1).Info("domain claimed", "uid", req.UID, "specHash", req.SpecHash)
		return dom, nil
	}
	if !isCode(err, libvirt.ErrOperationFailed) {
		return libvirt.Domain{}, err
	}
	// The name was defined between the lookup and the claim: its mark says by whom.
	other, lerr := b.DomainLookupByName(req.Name)
	if lerr != nil {
		return libvirt.Domain{}, err
	}
	if _, merr := p.ownMark(b, plan, other); merr != nil {
		return libvirt.Domain{}, merr
	}
	return libvirt.Domain{}, provider.Errorf(provider.ErrTransient,
		"domain %s on host %s was defined by another call of this install meanwhile; trying again", req.Name, h.Name)
}

// claim defines the claim of name on host h carrying mark m (see buildClaimXML). It fails
// with libvirt's ErrOperationFailed ("already exists") when the name is defined.
func (p *Provider) claim(b backend, h provider.KVMHost, name string, m ident.Mark) (libvirt.Domain, error) {
	meta, err := ident.MarshalMark(p.metaNS, m)
	if err != nil {
		return libvirt.Domain{}, provider.Permanent(err)
	}
	xml, err := buildClaimXML(name, h.DomainType, meta)
	if err != nil {
		return libvirt.Domain{}, provider.Permanent(err)
	}
	dom, err := b.DomainDefineXMLFlags(xml, 0)
	if err != nil {
		return libvirt.Domain{}, fmt.Errorf("claiming domain %s on host %s: %w", name, h.Name, err)
	}
	return dom, nil
}

// formatUUID renders u as libvirt prints it, for a definition that replaces a claim.
func formatUUID(u libvirt.UUID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// volumes makes the disks of a new domain over base: the overlay and a freshly built
// seed. It returns their paths.
func (p *Provider) volumes(log logr.Logger, b backend, plan createPlan, pool libvirt.StoragePool, base imagecache.Base) (overlay, seed string, err error) {
	h := plan.host
	if overlay, err = p.ensureOverlay(log, b, h, pool, plan.req.Name, base); err != nil {
		return "", "", err
	}
	if seed, err = p.uploadSeed(log, b, h, pool, plan.req); err != nil {
		return "", "", err
	}
	return overlay, seed, nil
}

// ownMark reads the mark of the existing domain of the requested name and returns it
// when this Create may take the domain over (checkAdoption).
func (p *Provider) ownMark(b backend, plan createPlan, dom libvirt.Domain) (ident.Mark, error) {
	m, found, err := p.readMark(b, plan.host.Name, dom)
	if err != nil {
		return ident.Mark{}, err
	}
	return m, p.checkAdoption(plan.host.Name, plan.req.Name, plan.req.UID, m, found)
}

// adopt takes over an existing domain of the requested name whose mark m is ours, and
// starts it when it is shut off. Its disks already exist: the seed is only rebuilt before
// a domain is defined, because a defined domain proves an earlier upload completed.
func (p *Provider) adopt(ctx context.Context, log logr.Logger, b backend, plan createPlan, dom libvirt.Domain, m ident.Mark) (provider.Instance, error) {
	h, req := plan.host, plan.req
	state, reason, err := b.DomainGetState(dom, 0)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("reading the state of domain %s on host %s: %w", req.Name, h.Name, err)
	}
	switch s := libvirt.DomainState(state); s {
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		log.V(1).Info("kvm2 domain ensured running", "id", domainID(dom))
	case libvirt.DomainPaused:
		// libvirt starts QEMU paused and resumes it once the start completes. A Create
		// cut off during DomainCreate (the operator killed) meets that state on retry;
		// nobody paused it, so wait rather than fail.
		if libvirt.DomainPausedReason(reason) == libvirt.DomainPausedStartingUp {
			return provider.Instance{}, provider.Errorf(provider.ErrTransient,
				"domain %s on host %s is starting up; waiting for it to settle", req.Name, h.Name)
		}
		return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s is %s and cannot be started by the operator; resume or destroy it on the host",
			req.Name, h.Name, s)
	case libvirt.DomainPmsuspended:
		return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s is %s and cannot be started by the operator; resume or destroy it on the host",
			req.Name, h.Name, s)
	case libvirt.DomainShutoff, libvirt.DomainCrashed:
		if s == libvirt.DomainCrashed {
			// A crashed domain kept for inspection is still active; it starts only
			// after a destroy.
			if err := b.DomainDestroyFlags(dom, 0); err != nil && !isCode(err, libvirt.ErrOperationInvalid) {
				return provider.Instance{}, fmt.Errorf("destroying crashed domain %s on host %s: %w", req.Name, h.Name, err)
			}
		}
		if err := p.start(ctx, log, b, h, dom); err != nil {
			return provider.Instance{}, err
		}
	default:
		return provider.Instance{}, provider.Errorf(provider.ErrTransient,
			"domain %s on host %s is %s; waiting for it to settle", req.Name, h.Name, s)
	}
	return p.instance(h, dom, req.UID, m.CreatedAt), nil
}

// start boots dom and waits until libvirt reports it running.
func (p *Provider) start(ctx context.Context, log logr.Logger, b backend, h provider.KVMHost, dom libvirt.Domain) error {
	if err := b.DomainCreate(dom); err != nil {
		return fmt.Errorf("starting domain %s on host %s: %w", dom.Name, h.Name, err)
	}
	log.V(1).Info("domain started")
	if err := p.waitRunning(ctx, b, h, dom); err != nil {
		return err
	}
	log.V(1).Info("kvm2 domain ensured running", "id", domainID(dom))
	return nil
}

// waitRunning polls the state of a domain that was just started. A domain that is shut
// off, crashed or paused right after its start fails at once instead of waiting out the
// cap; all of these are transient, since the next attempt starts it again.
func (p *Provider) waitRunning(ctx context.Context, b backend, h provider.KVMHost, dom libvirt.Domain) error {
	deadline := time.Now().Add(p.runningWait)
	for {
		state, _, err := b.DomainGetState(dom, 0)
		if err != nil {
			return fmt.Errorf("reading the state of domain %s on host %s: %w", dom.Name, h.Name, err)
		}
		switch s := libvirt.DomainState(state); s {
		case libvirt.DomainRunning, libvirt.DomainBlocked:
			return nil
		case libvirt.DomainShutoff, libvirt.DomainCrashed, libvirt.DomainPaused, libvirt.DomainPmsuspended:
			return provider.Errorf(provider.ErrTransient,
				"domain %s on host %s is %s right after its start", dom.Name, h.Name, s)
		default:
			if !time.Now().Before(deadline) {
				return provider.Errorf(provider.ErrTransient,
					"domain %s on host %s is still %s %s after its start", dom.Name, h.Name, s, p.runningWait)
			}
		}
		t := time.NewTimer(p.runningPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return provider.Transient(fmt.Errorf("waiting for domain %s on host %s to run: %w", dom.Name, h.Name, ctx.Err()))
		case <-t.C:
		}
	}
}

// ensureOverlay creates the VM's disk afresh and returns its path. It runs only when no
// domain of the name is defined, so an overlay already there is a left-over (an
// interrupted attempt, a Delete that removed the definition but not the volumes) and
// may sit on another base image or hold another instance's boot: it is replaced, never
// reused.
func (p *Provider) ensureOverlay(log logr.Logger, b backend, h provider.KVMHost, pool libvirt.StoragePool, vm string, base imagecache.Base) (string, error) {
	name := overlayVolName(vm)
	capacity := uint64(p.cfg.DiskSizeGb) << 30
	xml, err := overlayVolumeXML(name, capacity, base.Path, base.Format)
	if err != nil {
		return "", provider.Permanent(err)
	}
	vol, replaced, err := createVolumeAfresh(b, h, pool, "overlay", name, xml)
	if err != nil {
		return "", err
	}
	kv := []any{"volume", name, "capacityBytes", capacity}
	if replaced {
		kv = append(kv, "replacedLeftOver", true)
	}
	log.V(1).Info("overlay volume created", kv...)
	path, err := b.StorageVolGetPath(vol)
	if err != nil {
		return "", fmt.Errorf("resolving the path of overlay %s on host %s: %w", name, h.Name, err)
	}
	return path, nil
}

// createVolumeAfresh creates volume name (a kind of volume, for messages) from xml in
// pool; when one of that name exists already it is deleted first. replaced says so.
func createVolumeAfresh(b backend, h provider.KVMHost, pool libvirt.StoragePool, kind, name, xml string) (vol libvirt.StorageVol, replaced bool, err error) {
	vol, err = b.StorageVolCreateXML(pool, xml, 0)
	if isCode(err, libvirt.ErrStorageVolExist) {
		replaced = true
		old, lerr := b.StorageVolLookupByName(pool, name)
		if lerr != nil {
			return vol, replaced, fmt.Errorf("looking up the old %s %s in pool %s on host %s: %w", kind, name, h.Pool, h.Name, lerr)
		}
		if derr := b.StorageVolDelete(old, 0); derr != nil {
			return vol, replaced, fmt.Errorf("deleting the old %s %s in pool %s on host %s: %w", kind, name, h.Pool, h.Name, derr)
		}
		vol, err = b.StorageVolCreateXML(pool, xml, 0)
	}
	if err != nil {
		return vol, replaced, fmt.Errorf("creating %s %s in pool %s on host %s: %w", kind, name, h.Pool, h.Name, err)
	}
	return vol, replaced, nil
}

// uploadSeed builds the seed ISO and uploads it as a fresh raw volume, replacing any seed
// an earlier attempt left: that one may have been cut off mid-upload, and a truncated
// seed would boot the VM without its cloud-init. It returns the volume's path.
func (p *Provider) uploadSeed(log logr.Logger, b backend, h provider.KVMHost, pool libvirt.StoragePool, req provider.CreateRequest) (string, error) {
	iso, err := buildSeedISO(req.Name, req.CloudInit, vendorData(p.cfg.VendorData, p.cfg.GuestAgent()))
	if err != nil {
		return "", provider.Transient(err)
	}
	name := seedVolName(req.Name)
	xml, err := rawVolumeXML(name, uint64(len(iso)))
	if err != nil {
		return "", provider.Permanent(err)
	}
	vol, _, err := createVolumeAfresh(b, h, pool, "seed", name, xml)
	if err != nil {
		return "", err
	}
	if err := b.StorageVolUpload(vol, bytes.NewReader(iso), 0, uint64(len(iso)), 0); err != nil {
		return "", fmt.Errorf("uploading seed %s to pool %s on host %s: %w", name, h.Pool, h.Name, err)
	}
	log.V(1).Info("seed volume uploaded", "volume", name, "bytes", len(iso))
	path, err := b.StorageVolGetPath(vol)
	if err != nil {
		return "", fmt.Errorf("resolving the path of seed %s on host %s: %w", name, h.Name, err)
	}
	return path, nil
}

func (p *Provider) instance(h provider.KVMHost, dom libvirt.Domain, uid string, created time.Time) provider.Instance {
	return provider.Instance{
		ProviderID: ident.ProviderID(h.Name, dom.Name),
		Name:       dom.Name,
		UID:        uid,
		State:      provider.StateRunning,
		CreatedAt:  created,
	}
}

// isCode reports whether err carries libvirt error number code.
func isCode(err error, code libvirt.ErrorNumber) bool {
	c, ok := libvirtCode(err)
	return ok && c == code
}
