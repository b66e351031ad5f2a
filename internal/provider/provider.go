// Package provider holds the contract between the Proxy reconciler and the backends that
// run proxy instances: the Provider interface, its request and result types, the error
// classes (four failures and the pending result), the providers config and the registry that builds providers from it.
package provider

import (
	"context"
	"time"
)

// Provider runs proxy instances somewhere. Every error a method returns carries exactly
// one class (ErrPermanent, ErrQuotaExceeded, ErrNotFound, ErrTransient, or for Create the
// ErrPending result), attached by wrapping and tested with errors.Is; an error without a
// class is treated as transient.
type Provider interface {
	// Create makes sure an instance named req.Name exists, is owned by req.UID and is
	// running, and returns it. It is idempotent by Name: a repeat call adopts what an
	// earlier, possibly interrupted, call left behind, unless that was built from
	// another req.SpecHash, which it replaces. It never touches an instance another
	// install of the operator made.
	// Errors: ErrPermanent for input or state a retry cannot fix (unknown placement,
	// an instance of that name owned by another UID, which also wraps ErrOwnedByOther,
	// or made by another install); ErrQuotaExceeded when capacity is short and a later
	// retry may succeed; ErrTransient otherwise. Never ErrNotFound.
	// Pending: a Create whose work outlives the call (a base image download) may start
	// that work in the background, on a context the provider owns, and return ErrPending
	// at once (Pending, carrying the work's Progress) instead of holding the caller. The
	// caller repeats the same request after a short fixed wait; a repeat joins the work
	// still running (pending again), goes on once it is done, or returns the class of its
	// failure, once to every Create that waited on it. A provider that never pends
	// simply never returns it. Close cancels such work.
	Create(ctx context.Context, req CreateRequest) (Instance, error)

	// Get returns the instance named by providerID.
	// Errors: ErrNotFound when it no longer exists (the caller creates it again);
	// ErrPermanent for a providerID this provider cannot interpret; ErrTransient otherwise.
	Get(ctx context.Context, providerID string) (Instance, error)

	// Delete removes the instance and everything created for it. An instance that is
	// already gone, or that is not this provider's and install's, is success (and is
	// left alone).
	// Errors: ErrPermanent for a providerID this provider cannot interpret; ErrPermanent
	// wrapping ErrLeftBehind when the place the instance lives can no longer be reached
	// or named (a kvm2 host removed from the config), so the instance may still run
	// there: the message says where and how to remove it by hand; ErrTransient
	// otherwise. Never ErrNotFound.
	Delete(ctx context.Context, providerID string) error

	// ListByTag returns every instance carrying this provider's ownership mark written by
	// this install of the operator, and nothing else. Orphan GC deletes from this list, so
	// an instance this install's provider did not create must never appear in it. What is
	// left of an instance it made (gce: a firewall rule whose VM was never made) may be
	// listed too, in StateUnknown with its owner UID and creation time, when Delete of its
	// providerID removes it.
	// Errors: ErrTransient (or ErrPermanent for broken credentials); a failed listing
	// returns no partial result.
	ListByTag(ctx context.Context) ([]Instance, error)

	// Check probes every target (for kvm2: every host) and returns one status per target,
	// in config order. It reports failures in the statuses; it has no error result.
	Check(ctx context.Context) []TargetStatus
}

// Placement says where and how an instance runs; each provider gives the fields meaning.
type Placement struct {
	Region      string `json:"region,omitempty"`
	Zone        string `json:"zone,omitempty"`
	MachineType string `json:"machineType,omitempty"`
	Image       string `json:"image,omitempty"`
}

// CreateRequest is what the reconciler asks a provider to run.
type CreateRequest struct {
	// Name is the deterministic instance name (proxy-<16 hex>).
	Name string
	// UID is the owning Proxy's metadata.uid, recorded on the instance.
	UID       string
	Placement Placement
	// CloudInit is the user-data, passed to the instance byte for byte.
	CloudInit []byte
	// Port is the proxy port the instance serves on.
	Port int32
	// SourceRanges are the networks that may use the proxy (spec.proxy.allowedSourceRanges);
	// a provider that manages firewalls (gce) admits the port from them. Empty means the
	// provider's own default.
	SourceRanges []string
	// SpecHash is the hash of the Proxy spec the instance is built from. A provider
	// records it on the instance, so that a repeat Create finding an instance built from
	// another spec replaces it instead of adopting it. Empty means unknown.
	SpecHash string
	// Pool is the ProxyPool the Proxy is a child of; zero for a standalone Proxy. A
	// provider that writes firewall rules (gce) shares one rule among the children of a
	// pool that admit the same sources on the same port.
	Pool PoolRef
}

// PoolRef names a ProxyPool: its namespace, name and metadata.uid (the UID tells a pool
// from an earlier one of the same name).
type PoolRef struct {
	Namespace, Name, UID string
}

// Instance states shared by providers.
const (
	StateRunning     = "Running"
	StatePending     = "Pending"
	StateStopped     = "Stopped"
	StateUnknown     = "Unknown"
	StateTerminating = "Terminating"
)

// Instance is what a provider knows about one running (or starting) proxy.
type Instance struct {
	ProviderID string
	Name       string
	UID        string
	State      string
	// IP is empty until the provider has learnt the instance's address.
	IP string
	// IPv6 is the instance's external IPv6 address, when it has one (gce with stackType
	// IPV4_IPV6; hcloud: the ::1 of the server's /64); IP stays its IPv4 address.
	IPv6      string
	CreatedAt time.Time
}

// TargetStatus is the health of one provider target (a hypervisor host, a region...).
type TargetStatus struct {
	Target  string
	Ready   bool
	Reason  string
	Message string
	Latency time.Duration
	Details map[string]string
}

// ProbeHinter is implemented by a provider that knows the likely cause when a guest it
// runs never answers the health probe (gce: an image without cloud-init). The health
// engine adds the hint to the Healthy condition's message of a Proxy that has not passed
// a probe yet.
type ProbeHinter interface {
	NeverAnsweredHint() string
}

// NeverAnsweredHint is p's ProbeHinter hint, looking through decorators that Unwrap to
// the provider they wrap; "" when p gives none.
func NeverAnsweredHint(p Provider) string {
	for p != nil {
		if h, ok := p.(ProbeHinter); ok {
			return h.NeverAnsweredHint()
		}
		u, ok := p.(interface{ Unwrap() Provider })
		if !ok {
			return ""
		}
		p = u.Unwrap()
	}
	return ""
}

// Rebooter is implemented by a provider that can restart an instance in place (kvm2 and
// the kvm type built on its code, gce). Remediation reboots a guest that never came up
// or stopped answering before it replaces it; a provider without it is only ever
// replaced. Find it with RebooterOf, which looks through decorators.
type Rebooter interface {
	// Reboot restarts the instance providerID names the hard way, in place: the same
	// instance (name, providerID, disk, addresses) is reset as by a power cycle, without
	// asking the guest, which boots again from its disk and so runs only cloud-init's
	// per-boot parts (the instance ID stays the same). A stopped instance is started.
	// It returns once the provider has done the restart (or start), not when the guest
	// answers. It is idempotent enough to be retried: a retry after a failure, or after
	// an answer that was lost, restarts the instance again at worst. It checks the
	// ownership mark first and never restarts an instance that is not this provider's and
	// install's.
	// Errors: ErrNotFound when the instance no longer exists (the caller creates it
	// again); ErrPermanent for a providerID this provider cannot interpret, an instance
	// that is not this provider's and install's (left untouched), or one in a state the
	// operator must not change (kvm2: paused or suspended by someone on the host; gce:
	// SUSPENDED); ErrTransient otherwise (a host or the API away, an instance busy with
	// another operation).
	Reboot(ctx context.Context, providerID string) error
}

// RebooterOf returns p's Rebooter, looking through decorators that Unwrap to the provider
// they wrap: the outermost one that implements Reboot (the observing decorator, so that
// the call is traced and counted), but only when the provider at the bottom of the chain
// implements it too. ok is false when p cannot reboot.
func RebooterOf(p Provider) (r Rebooter, ok bool) {
	var outer Rebooter
	for p != nil {
		pr, can := p.(Rebooter)
		if can && outer == nil {
			outer = pr
		}
		u, wraps := p.(interface{ Unwrap() Provider })
		if !wraps {
			if !can {
				return nil, false
			}
			return outer, true
		}
		p = u.Unwrap()
	}
	return nil, false
}
