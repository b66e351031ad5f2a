package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyMode says who runs the proxy.
// +kubebuilder:validation:Enum=Managed;External
type ProxyMode string

const (
	// ProxyModeManaged: the operator creates and deletes the instance through a provider.
	ProxyModeManaged ProxyMode = "Managed"
	// ProxyModeExternal: the proxy already exists at spec.address; the operator only
	// checks and publishes it.
	ProxyModeExternal ProxyMode = "External"
)

// ProxyPhase is the coarse state of a Proxy.
// +kubebuilder:validation:Enum=Pending;Provisioning;Running;Ready;Failed;Deleting
type ProxyPhase string

const (
	// PhasePending: accepted, nothing asked of the provider yet.
	PhasePending ProxyPhase = "Pending"
	// PhaseProvisioning: the provider is creating or replacing the instance, or the
	// instance has no address yet.
	PhaseProvisioning ProxyPhase = "Provisioning"
	// PhaseRunning: the instance runs and has an address; not (yet) proven healthy.
	PhaseRunning ProxyPhase = "Running"
	// PhaseReady: the health engine has proxied a request through it.
	PhaseReady ProxyPhase = "Ready"
	// PhaseFailed: a permanent error; nothing is retried until the spec changes.
	PhaseFailed ProxyPhase = "Failed"
	// PhaseDeleting: the Proxy is being deleted and its instance removed.
	PhaseDeleting ProxyPhase = "Deleting"
)

// Condition types on a Proxy.
const (
	// ConditionProvisioned is True when the instance exists, runs and has an address.
	ConditionProvisioned = "Provisioned"
	// ConditionHealthy is True when the last probe through the proxy succeeded.
	ConditionHealthy = "Healthy"
	// ConditionConfigOutdated is True when the instance runs a configuration other than
	// the one the operator would build for it now without the user having asked for a
	// change: the operator's rendering changed (an upgrade) or, for a pool child, the
	// credentials it references were rotated. A standalone Proxy keeps its instance until
	// ReplaceAnnotation is set; its pool replaces a child surge-first.
	ConditionConfigOutdated = "ConfigOutdated"
	// ConditionPreempted is True, reason Preempted, from the moment the reconciler finds
	// the Proxy's instance reclaimed by its cloud (a gce Spot VM preempted) until the
	// successor is Ready (its probe succeeded), when the reconciler removes it. Its message says which
	// instance went, where and when.
	ConditionPreempted = "Preempted"
	// ConditionRetired is True, reason BannedOnManySites, while the operator holds the
	// Proxy cordoned because crawlers reported it banned on too many sites within the
	// retirement window (the egress.hrajfrisbee.cz/retired annotation is there). Written
	// by the leader under the proxy-bans field manager.
	ConditionRetired = "Retired"
	// ReasonBannedOnManySites is the Retired condition's reason.
	ReasonBannedOnManySites = "BannedOnManySites"
)

// Conditions on both Proxies and ProxyPools for tools that judge an object by its status
// the way sigs.k8s.io/cli-utils' kstatus does (kubectl wait, Flux, Argo CD). Each object
// has Ready; Reconciling and Stalled are there only while True ("abnormal-true"), and
// never both.
const (
	// ConditionReady is True when the object is what it should be: a Proxy Ready (its
	// probe passes), a pool with replicas children all up to date and available.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the operator is working towards Ready and needs
	// nothing from the user: creating, booting, waiting for a probe, rolling out, scaling.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the object cannot become Ready without a change by
	// the user (a permanent provider error, a missing or unlabelled Secret, a broken
	// template, a progress deadline passed); its reason and message say which.
	ConditionStalled = "Stalled"
)

// Labels and annotations on Proxies and the Secrets they use.
const (
	// ReplaceAnnotation set to a new value on a Proxy asks for its instance to be built
	// again from the current configuration (after an upgrade that changed the rendering).
	ReplaceAnnotation = "egress.hrajfrisbee.cz/replace"
	// CredentialsLabel set to "true" on a Secret opts it in as a proxy-credentials Secret,
	// one the operator may read; the snapshots it makes carry it too.
	CredentialsLabel = "egress.hrajfrisbee.cz/proxy-credentials"
)

// Condition reasons on a Proxy.
const (
	ReasonProvisioning     = "Provisioning"
	ReasonImageDownloading = "ImageDownloading"
	ReasonQuotaExceeded    = "QuotaExceeded"
	ReasonPermanentError   = "PermanentError"
	ReasonTransientError   = "TransientError"
	ReasonInstanceRunning  = "InstanceRunning"
	// ReasonAddressLost (Provisioned=True, phase Provisioning): the instance runs, but no
	// longer reports the address it had (past the address hold): a guest whose network
	// failed. It is out of rotation and, for remediation, unhealthy since it went out,
	// not booting.
	ReasonAddressLost           = "AddressLost"
	ReasonProviderNotConfigured = "ProviderNotConfigured"
	ReasonExternal              = "External"
	ReasonDeleting              = "Deleting"
	ReasonProbeSucceeded        = "ProbeSucceeded"
	ReasonProbeFailed           = "ProbeFailed"
	// ReasonOwnedByOther: phase Failed because an instance of the Proxy's name belongs
	// to another Proxy UID (an older Proxy of the same name). Unlike PermanentError it
	// is checked again without a spec change. Another install's instance is a plain
	// PermanentError: this install's GC never removes it.
	ReasonOwnedByOther = "OwnedByOther"
	// ReasonCredentialsUnavailable: the Secret spec.proxy.basicAuth.secretRef names is
	// missing, lacks a key, or holds values tinyproxy cannot take. The Proxy waits for the
	// Secret (which the operator watches); an existing instance is left as it is.
	ReasonCredentialsUnavailable = "CredentialsUnavailable"
	// ReasonRenderingChanged (ConfigOutdated=True): this operator version renders another
	// configuration than the instance was built with.
	ReasonRenderingChanged = "RenderingChanged"
	// ReasonCredentialsChanged (ConfigOutdated=True): a pool child's credential Secret
	// changed; the child keeps serving with the credentials it was built with until its
	// pool replaces it.
	ReasonCredentialsChanged = "CredentialsChanged"
	// ReasonUpToDate (ConfigOutdated=False).
	ReasonUpToDate = "UpToDate"
	// ReasonEgressUnavailable: the WireGuard Secret spec.proxy.egress.wireguard names
	// (secretRef or assignedSecretRef) is missing, lacks the opt-in label or the key
	// wg0.conf, or holds a configuration that does not parse; the message names the
	// Secret and the key or line. The Proxy waits for the Secret, like
	// CredentialsUnavailable.
	ReasonEgressUnavailable = "EgressUnavailable"
	// ReasonEgressMismatch (Healthy=False): the probe target saw the proxy's traffic
	// leave from another address than the egressIP its WireGuard Secret states, so the
	// traffic does not go through the exit it should (a leak, or the wrong exit). The
	// proxy is out of rotation at once; the message names both addresses.
	ReasonEgressMismatch = "EgressMismatch"
)

// Event reasons on a Proxy that are no condition reason.
const (
	// ReasonInstanceLeftBehind: an instance the operator stopped managing may still
	// exist (its host left the providers config, its provider cannot delete it); the
	// Event's note says where and how to remove it by hand.
	ReasonInstanceLeftBehind = "InstanceLeftBehind"
	// ReasonReplaceIgnored: the Proxy carries a new ReplaceAnnotation value the operator
	// cannot act on (an External Proxy has no instance to build; a pool child is
	// replaced by its pool). The Event's note says why and what to do instead.
	ReasonReplaceIgnored = "ReplaceIgnored"
	// ReasonAdopted: a Proxy built by an operator version before the intent hash was
	// recorded has been taken over without replacing its instance.
	ReasonAdopted = "Adopted"
	// ReasonPreempted: the instance was reclaimed by its cloud (a Spot VM preempted); a
	// Warning Event of this reason, and the reason of ConditionPreempted.
	ReasonPreempted = "Preempted"
)

// ProxyPlacement says where and how the instance runs; each provider gives the fields
// their meaning.
type ProxyPlacement struct {
	// Region, for providers that have regions. Part of the spec hash.
	// +optional
	Region string `json:"region,omitempty"`
	// Zone, for kvm2 the name of the host in the provider's hosts list.
	// +optional
	Zone string `json:"zone,omitempty"`
	// MachineType names a size profile of the provider.
	// +optional
	MachineType string `json:"machineType,omitempty"`
	// Image names an image of the provider's catalogue (kvm2: or an http(s) URL).
	// +optional
	Image string `json:"image,omitempty"`
}

// CIDR is a network in CIDR notation, such as 10.0.0.0/8 or 2001:db8::/32.
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a network in CIDR notation, such as 10.0.0.0/8 or 2001:db8::/32 (one address is 192.0.2.7/32)"
type CIDR string

// SecretName names a Secret in the Proxy's namespace.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="spec.proxy.basicAuth.secretRef.name must be the name of a Secret: lower-case letters, digits, '-' and '.'"
type SecretName string

// BasicAuthSecretRef names the Secret holding a proxy's credentials.
type BasicAuthSecretRef struct {
	// Name of a Secret in the Proxy's namespace with the keys "username" and "password".
	// +required
	Name SecretName `json:"name"`
}

// ProxyBasicAuth says where a proxy's basic-auth credentials are.
type ProxyBasicAuth struct {
	// SecretRef names the Secret with the keys "username" and "password". For a Managed
	// Proxy both may hold only letters, digits, '-', '.' and '_', at most 256 together
	// (what tinyproxy's configuration accepts).
	// +required
	SecretRef BasicAuthSecretRef `json:"secretRef"`
}

// WireGuardSecretRef names a Secret holding one WireGuard configuration.
type WireGuardSecretRef struct {
	// Name of a Secret in the Proxy's namespace, labelled
	// egress.hrajfrisbee.cz/proxy-credentials: "true", with the key "wg0.conf" (one
	// configuration in wg-quick form: an [Interface] with PrivateKey and Address, one
	// [Peer] with PublicKey, Endpoint and AllowedIPs 0.0.0.0/0, ::/0) and optionally
	// "egressIP" (the exit's public address as the VPN provider states it; checked to be
	// an IP address and covered by the spec hash).
	// +required
	Name SecretName `json:"name"`
}

// ProxyWireGuard says which WireGuard configuration the proxy's outbound traffic leaves
// through. Set at most one of secretRef (by hand) and assignedSecretRef (by a pool).
// +kubebuilder:validation:XValidation:rule="!(has(self.secretRef) && has(self.assignedSecretRef))",message="spec.proxy.egress.wireguard: secretRef (set by hand) and assignedSecretRef (an assigned configuration) are both set; a proxy uses one WireGuard configuration: remove one of them"
type ProxyWireGuard struct {
	// SecretRef names the WireGuard Secret, set by hand.
	// +optional
	SecretRef *WireGuardSecretRef `json:"secretRef,omitempty"`
	// AssignedSecretRef names a WireGuard Secret assigned to the Proxy rather than chosen
	// by hand (for a controller that hands out exits); it is read exactly like secretRef.
	// +optional
	AssignedSecretRef *WireGuardSecretRef `json:"assignedSecretRef,omitempty"`
}

// ProxyEgress says how the proxy's outbound traffic leaves the guest.
type ProxyEgress struct {
	// WireGuard, when set, routes only the proxy's own outbound connections through a
	// WireGuard tunnel, fail-closed: while the tunnel is down they have no route at all.
	// The guest's agent, DHCP, the proxy's inbound port and its DNS keep using the
	// guest's own network.
	// +optional
	WireGuard *ProxyWireGuard `json:"wireguard,omitempty"`
}

// ProxyRemediation is when a Managed Proxy is rebooted or replaced by remediation.
type ProxyRemediation struct {
	// BootTimeout: a proxy whose instance has run this long without answering a probe is
	// remediated (reason BootTimeout). Default: the manager's --remediation-boot-timeout
	// (10m). From 1m to 24h.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="spec.remediation.bootTimeout must be a duration from 1m to 24h, such as 10m"
	// +optional
	BootTimeout *metav1.Duration `json:"bootTimeout,omitempty"`
	// UnhealthyTimeout: a proxy that answered once and has then failed its probes this
	// long is remediated (reason Unhealthy). Default: the manager's
	// --remediation-unhealthy-timeout (5m). From 1m to 24h.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="spec.remediation.unhealthyTimeout must be a duration from 1m to 24h, such as 5m"
	// +optional
	UnhealthyTimeout *metav1.Duration `json:"unhealthyTimeout,omitempty"`
	// MaxAttempts is how many reboots and replacements are tried for one fault before
	// remediation gives up: the Proxy is then Stalled (condition Remediating=False,
	// reason AttemptsExhausted) until it is healthy again or the user acts. Default 5.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxAttempts *int32 `json:"maxAttempts,omitempty"`
	// Disabled: the proxy is never rebooted or replaced by remediation (it still counts
	// in its group's maxUnhealthy brake).
	// +optional
	Disabled bool `json:"disabled,omitempty"`
}

// ProxyConfig is the proxy's own configuration, which the operator renders for a Managed
// Proxy (tinyproxy, as cloud-init) and the health probe and discovery use.
// +kubebuilder:validation:XValidation:rule="!has(self.allowedSourceRanges) || has(self.basicAuth) || (has(self.allowOpenProxy) && self.allowOpenProxy) || !self.allowedSourceRanges.exists(r, isCIDR(r) && cidr(r).prefixLength() == 0)",fieldPath=".allowedSourceRanges",message="holds 0.0.0.0/0 or ::/0 without basicAuth: anyone could use the proxy. Add basicAuth (a Secret with the credentials), narrow the ranges to the crawlers' networks, or set allowOpenProxy: true to run an open proxy on purpose"
type ProxyConfig struct {
	// AllowedSourceRanges are the networks that may use the proxy: the crawlers and the
	// operator's health probes must come from one of them. Required for a Managed Proxy.
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	// +optional
	AllowedSourceRanges []CIDR `json:"allowedSourceRanges,omitempty"`
	// BasicAuth, when set, makes the proxy demand these credentials (Proxy-Authorization).
	// On an External Proxy it tells the operator which credentials the proxy expects.
	// +optional
	BasicAuth *ProxyBasicAuth `json:"basicAuth,omitempty"`
	// AllowOpenProxy, when true, lets allowedSourceRanges hold 0.0.0.0/0 or ::/0 without
	// basicAuth: a proxy anyone who reaches it may use. Without it the API server refuses
	// such a Proxy.
	// +optional
	AllowOpenProxy bool `json:"allowOpenProxy,omitempty"`
	// AllowedDestinations are networks the proxy may connect to although its guest fence
	// refuses them: loopback, the private (RFC 1918), shared (100.64.0.0/10), link-local,
	// unique-local and multicast ranges and the guest's own subnets. Each one is a hole
	// in the fence on purpose: an exception for a private range makes the proxy a way
	// into that network for everyone who may use it. The metadata addresses stay refused.
	// Only a Managed Proxy has the fence.
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	// +optional
	AllowedDestinations []CIDR `json:"allowedDestinations,omitempty"`
	// Egress says how the proxy's outbound traffic leaves the guest (a Managed Proxy
	// only): through the guest's own network when unset.
	// +optional
	Egress *ProxyEgress `json:"egress,omitempty"`
}

// WireGuardRef is the name of the WireGuard Secret spec.proxy.egress.wireguard names
// (secretRef or assignedSecretRef) and the field that names it, or "" and "".
func (p *Proxy) WireGuardRef() (name, field string) {
	if p.Spec.Proxy == nil || p.Spec.Proxy.Egress == nil || p.Spec.Proxy.Egress.WireGuard == nil {
		return "", ""
	}
	wg := p.Spec.Proxy.Egress.WireGuard
	switch {
	case wg.SecretRef != nil:
		return string(wg.SecretRef.Name), "spec.proxy.egress.wireguard.secretRef"
	case wg.AssignedSecretRef != nil:
		return string(wg.AssignedSecretRef.Name), "spec.proxy.egress.wireguard.assignedSecretRef"
	}
	return "", ""
}

// The cross-field rules of ProxySpec about provider and address sit on Proxy.spec, not
// on the type, so that a ProxyPool template (whose provider may come from a spread
// entry, and may change) embeds the type without them. The spec.proxy rule stays here:
// a pool's children are Managed, so their template must obey it too.

// ProxySpec is what the user asks for.
// +kubebuilder:validation:XValidation:rule="!has(self.proxy) || (has(self.mode) && self.mode == 'External') || (has(self.proxy.allowedSourceRanges) && size(self.proxy.allowedSourceRanges) > 0)",message="spec.proxy.allowedSourceRanges is required when spec.proxy is set on a Managed Proxy: list the networks (CIDRs) the crawlers and the operator's probes come from"
type ProxySpec struct {
	// Mode is Managed (the operator creates the instance) or External (an existing proxy
	// at spec.address).
	// +kubebuilder:default=Managed
	// +optional
	Mode ProxyMode `json:"mode,omitempty"`
	// Provider names an entry of the providers config. Required for Managed; immutable.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Provider string `json:"provider,omitempty"`
	// Placement says where the instance runs.
	// +optional
	Placement ProxyPlacement `json:"placement,omitempty"`
	// CloudInit is the instance's user-data. Without spec.proxy it is handed to the
	// provider byte for byte; with spec.proxy it is combined with the rendered proxy
	// configuration into one cloud-init MIME multipart document.
	// +optional
	CloudInit string `json:"cloudInit,omitempty"`
	// Proxy is the proxy's own configuration: who may use it and its credentials. When
	// set on a Managed Proxy the operator renders tinyproxy's configuration itself.
	// +optional
	Proxy *ProxyConfig `json:"proxy,omitempty"`
	// Port is the port the proxy listens on.
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// Address is the host name or IP of an External proxy, without a port.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$')",message="spec.address must be a host name or an IP address, without a port or scheme"
	// +optional
	Address string `json:"address,omitempty"`
	// Remediation says when a Managed Proxy whose VM never answers a probe, or stops
	// answering, is rebooted or replaced (docs/health.md, "Remediation"). Unset fields take
	// the manager's flags (--remediation-boot-timeout, --remediation-unhealthy-timeout).
	// +optional
	Remediation *ProxyRemediation `json:"remediation,omitempty"`
}

// ProxyStatus is what the operator observed.
type ProxyStatus struct {
	// Phase is the coarse state: Pending, Provisioning, Running, Ready, Failed, Deleting.
	// +optional
	Phase ProxyPhase `json:"phase,omitempty"`
	// ProviderID identifies the instance to its provider.
	// +optional
	ProviderID string `json:"providerID,omitempty"`
	// IP is the address to reach the proxy at.
	// +optional
	IP string `json:"ip,omitempty"`
	// IPv6 is the instance's external IPv6 address, when its provider gives it one
	// (gce with stackType IPV4_IPV6); ip stays the IPv4 address.
	// +optional
	IPv6 string `json:"ipv6,omitempty"`
	// Healthy is true while the proxy's probes go through it (the health engine's
	// threshold, see the Healthy condition), and absent otherwise: a proxy that is not
	// healthy has no healthy field, and its Healthy condition, False, says why.
	// +optional
	Healthy bool `json:"healthy,omitempty"`
	// SpecHash is the hash of what the user asked for when the instance was built:
	// provider, placement, spec.cloudInit and, with spec.proxy, port and every field of
	// spec.proxy, the Secrets it names by what they held (a slow salted digest of the
	// credentials, a digest of the WireGuard configuration). A new value (a spec edit, a
	// rotated password) replaces a standalone Proxy's instance; an operator upgrade
	// leaves it as it is.
	// +optional
	SpecHash string `json:"specHash,omitempty"`
	// RenderedHash is the hash of what the instance was built from as the operator
	// rendered it: provider, placement and the user-data (with the password as a slow
	// salted digest). It is also the spec hash the provider marks the instance with.
	// When this operator version renders another one, ConfigOutdated says so.
	// +optional
	RenderedHash string `json:"renderedHash,omitempty"`
	// CredentialsSecret names the Secret, owned by the Proxy, holding a copy of the
	// username and password the instance was built with (taken at its Create). The
	// health probe and discovery's ?credentials=true use it, so they send what the
	// instance demands even after the referenced Secret was rotated.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
	// ObservedReplace is the last value of the egress.hrajfrisbee.cz/replace annotation
	// the operator acted on; a new value asks for one more replacement.
	// +optional
	ObservedReplace string `json:"observedReplace,omitempty"`
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Message says what is going on, or what went wrong, in a sentence.
	// +optional
	Message string `json:"message,omitempty"`
	// Conditions: Provisioned, Healthy, ConfigOutdated and Preempted.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// LastProbeTime is when the health engine last probed the proxy.
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`
	// ProbeLatencyMilliseconds is the duration of the last successful probe.
	// +optional
	ProbeLatencyMilliseconds int64 `json:"probeLatencyMilliseconds,omitempty"`
	// EgressIP is the source address the probe target saw, when it reports one.
	// +optional
	EgressIP string `json:"egressIP,omitempty"`
	// ConsecutiveProbeFailures counts failed probes since the last success.
	// +optional
	ConsecutiveProbeFailures int32 `json:"consecutiveProbeFailures,omitempty"`
	// ProbeTarget is what the Healthy condition is about: the instance and address the
	// health engine last recorded a probe of ("<providerID> <ip>:<port>", or
	// "<ip>:<port>" for an External proxy). Phase Ready needs it to be the Proxy's
	// current instance and address.
	// +optional
	ProbeTarget string `json:"probeTarget,omitempty"`
	// Cooldowns are the sites crawlers reported this proxy banned or throttled on
	// (POST /v1/feedback), one entry per site, at most 100, the soonest-expiring dropped
	// first. Discovery leaves the proxy out of ?domain= answers for a site while its
	// entry's until is in the future. Written under the proxy-feedback field manager.
	// +listType=map
	// +listMapKey=site
	// +kubebuilder:validation:MaxItems=100
	// +optional
	Cooldowns []ProxyCooldown `json:"cooldowns,omitempty"`
	// CoolingSites counts the sites the proxy is cooling for now (entries of cooldowns
	// whose until is in the future). Written by the leader under the proxy-bans field
	// manager, again when a cooldown ends.
	// +optional
	CoolingSites int32 `json:"coolingSites,omitempty"`
	// Unreachable is the crawlers' word that they could not reach the proxy (POST
	// /v1/feedback with outcome unreachable), kept until a probe answers it: discovery
	// hands the proxy out to nobody while reportedAt is newer than
	// unreachableProbe.reportedAt. Written under the proxy-feedback field manager.
	// +optional
	Unreachable *ProxyUnreachable `json:"unreachable,omitempty"`
	// UnreachableProbe is the health engine's answer to the last unreachable report it
	// probed the proxy for. Written under the proxy-health field manager.
	// +optional
	UnreachableProbe *ProxyUnreachableProbe `json:"unreachableProbe,omitempty"`
	// Cost is what the proxy's instance costs per hour by its provider's prices (its
	// machine type and its external IPv4 address), while it has an instance; absent when
	// the provider has no price for it (kvm2 without prices). Written under the
	// egress-proxies-cost field manager.
	// +optional
	Cost *Cost `json:"cost,omitempty"`
}

// ProxyUnreachable is the crawlers' reports that a proxy could not be reached.
type ProxyUnreachable struct {
	// ReportedAt is when the first report since the last answered one reached a manager
	// replica.
	ReportedAt metav1.MicroTime `json:"reportedAt"`
	// Reports counts the reports since then.
	// +optional
	Reports int32 `json:"reports,omitempty"`
}

// ProxyUnreachableProbe is the probe that answered an unreachable report.
type ProxyUnreachableProbe struct {
	// ReportedAt is the status.unreachable.reportedAt the probe answered.
	ReportedAt metav1.MicroTime `json:"reportedAt"`
	// ProbedAt is when the probe's result was recorded.
	ProbedAt metav1.Time `json:"probedAt"`
	// Passed is whether the probe went through the proxy. After a passing answer,
	// unreachable reports of the proxy are ignored for the manager's
	// --unreachable-report-holdoff.
	// +optional
	Passed bool `json:"passed,omitempty"`
}

// CooldownOutcome is the last outcome that shaped a cooldown.
// +kubebuilder:validation:Enum=banned;throttled
type CooldownOutcome string

// The outcomes a cooldown records.
const (
	CooldownBanned    CooldownOutcome = "banned"
	CooldownThrottled CooldownOutcome = "throttled"
)

// ProxyCooldown is a proxy's ban record for one site.
type ProxyCooldown struct {
	// Site is the registrable domain (eTLD+1 by the public suffix list), such as
	// example.co.uk for shop.example.co.uk.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Site string `json:"site"`
	// Until is when the cooldown ends; after it the entry is kept only to remember the
	// ban streak.
	Until metav1.Time `json:"until"`
	// Bans is the streak of bans of this proxy on this site: each ban reported after the
	// previous cooldown ended doubles the next cooldown; an ok report after a cooldown
	// ends resets it.
	// +optional
	Bans int32 `json:"bans,omitempty"`
	// LastOutcome is the outcome of the last report that changed the entry.
	LastOutcome CooldownOutcome `json:"lastOutcome"`
	// LastBanned is when the last ban of the streak was reported: retirement counts the
	// sites a proxy was banned on within a window by it.
	// +optional
	LastBanned *metav1.Time `json:"lastBanned,omitempty"`
}

// Proxy is one egress HTTP proxy.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=px,categories=egress
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`,description="The Healthy condition: True while the last probes went through the proxy, False with the reason otherwise; empty until the first probe"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Egress IP",type=string,JSONPath=`.status.egressIP`,priority=1
// +kubebuilder:printcolumn:name="VM Age",type=date,JSONPath=`.status.conditions[?(@.reason=="InstanceRunning")].lastTransitionTime`,priority=1,description="Since the VM was last seen starting to run (the Provisioned condition with reason InstanceRunning); none for an External proxy or a VM not running"
// +kubebuilder:printcolumn:name="Cooling",type=integer,JSONPath=`.status.coolingSites`,priority=1,description="How many sites crawlers reported the proxy banned or throttled on and it is cooling for now"
// +kubebuilder:printcolumn:name="Latency (ms)",type=integer,JSONPath=`.status.probeLatencyMilliseconds`,priority=1,description="The last successful probe's latency through the proxy"
// +kubebuilder:printcolumn:name="Cost/h",type=string,JSONPath=`.status.cost.hourly`,priority=1,description="What the instance costs per hour by its provider's prices (status.cost, in status.cost.currency)"
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode == 'External') || (has(self.provider) && size(self.provider) > 0)",message="spec.provider is required when mode is Managed: name an entry of the providers config"
	// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'External' || (has(self.address) && size(self.address) > 0)",message="spec.address is required when mode is External: the host name or IP of the existing proxy"
	// +kubebuilder:validation:XValidation:rule="!has(oldSelf.provider) || (has(self.provider) && self.provider == oldSelf.provider)",message="spec.provider is immutable: delete the Proxy and create it again to use another provider"
	// +required
	Spec   ProxySpec   `json:"spec"`
	Status ProxyStatus `json:"status,omitempty"`
}

// InstanceName is the deterministic name of the Proxy's instance: "proxy-" and the first
// 16 hex characters of sha256(namespace/name). A Proxy recreated under the same namespace
// and name gets the same instance name, so its provider adopts what is left.
func (p *Proxy) InstanceName() string {
	sum := sha256.Sum256([]byte(p.Namespace + "/" + p.Name))
	return "proxy-" + hex.EncodeToString(sum[:])[:16]
}

// CurrentProbeTarget is the instance and address a probe of the Proxy goes through now,
// as status.probeTarget records them ("" while it has no address).
func (p *Proxy) CurrentProbeTarget() string {
	if p.Status.IP == "" {
		return ""
	}
	addr := net.JoinHostPort(p.Status.IP, strconv.Itoa(int(p.Port())))
	if p.Status.ProviderID == "" {
		return addr
	}
	return p.Status.ProviderID + " " + addr
}

// ProbedHealthy: the health engine's last recorded probe went through the Proxy's
// current instance and address (status.probeTarget) and succeeded (the Healthy
// condition True). The reconciler shows a Running Proxy as Ready exactly then.
func (p *Proxy) ProbedHealthy() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == ConditionHealthy {
			return c.Status == metav1.ConditionTrue && p.Status.Healthy &&
				p.Status.ProbeTarget != "" && p.Status.ProbeTarget == p.CurrentProbeTarget()
		}
	}
	return false
}

// ProxyList is a list of Proxies.
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}

func init() {
	register(&Proxy{}, &ProxyList{})
}
