package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels and annotations the ProxyPool controller puts on, or reads from, its children.
const (
	// PoolLabel carries the name of the ProxyPool a child Proxy belongs to.
	PoolLabel = "egress.hrajfrisbee.cz/pool"
	// TemplateHashLabel carries the hash of the pool template a child was made from.
	TemplateHashLabel = "egress.hrajfrisbee.cz/template-hash"
	// BornAnnotation is when the pool made a child (RFC 3339, by the controller's clock):
	// the start of its rotation age and of the Oldest/Newest deletion orders.
	BornAnnotation = "egress.hrajfrisbee.cz/born"
	// CordonAnnotation set to "true" on a Proxy takes it out of discovery and its pool's
	// EndpointSlice at once and makes it the first child of its pool to be replaced.
	CordonAnnotation = "egress.hrajfrisbee.cz/cordon"
	// RetiredAnnotation is set, with the cordon, on a Proxy the operator retired because
	// crawlers reported it banned on too many sites; its value says which and when. While
	// it is there the proxy is not retired again.
	RetiredAnnotation = "egress.hrajfrisbee.cz/retired"
)

// Condition types on a ProxyPool.
const (
	// PoolConditionAvailable is True while at least replicas - maxUnavailable children
	// have been Ready for minReadySeconds.
	PoolConditionAvailable = "Available"
	// PoolConditionProgressing is True while the pool creates, replaces or deletes
	// children; False once it holds replicas up-to-date available children, or when it
	// cannot go on.
	PoolConditionProgressing = "Progressing"
	// PoolConditionPlacementValid is False when the template or a spread entry names a
	// provider or zone the providers config lacks.
	PoolConditionPlacementValid = "PlacementValid"
	// PoolConditionEgressShared is True when two or more available children leave from
	// one egress address (status.egressIP): to the sites they reach they are one proxy.
	PoolConditionEgressShared = "EgressShared"
	// PoolConditionEgressExhausted (only with spec.egress.wireguard) is True when the pool
	// needs more children than it has free WireGuard configurations for.
	PoolConditionEgressExhausted = "EgressExhausted"
	// PoolConditionSaturated is True while some sites have more of the pool's serving
	// children cooling for them than maxCoolingPercent allows: discovery answers 503 to
	// ?pool= requests for those sites. Its message names the worst few.
	PoolConditionSaturated = "Saturated"
)

// Reasons of the Saturated condition.
const (
	PoolReasonSitesSaturated  = "SitesSaturated"
	PoolReasonNoSiteSaturated = "NoSiteSaturated"
)

// Condition reasons on a ProxyPool.
const (
	PoolReasonMinimumAvailable    = "MinimumReplicasAvailable"
	PoolReasonMinimumUnavailable  = "MinimumReplicasUnavailable"
	PoolReasonScalingUp           = "ScalingUp"
	PoolReasonScalingDown         = "ScalingDown"
	PoolReasonRollingOut          = "RollingOut"
	PoolReasonReplacing           = "Replacing"
	PoolReasonWaitingForAvailable = "WaitingForAvailable"
	PoolReasonComplete            = "Complete"
	PoolReasonStalled             = "Stalled"
	// PoolReasonProgressDeadlineExceeded (Progressing=False): no child became available
	// and none finished deleting for progressDeadlineSeconds while the pool was not
	// complete; the message names the children that hold it.
	PoolReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	// PoolReasonCredentialsUnavailable (Progressing=False): the Secret the template's
	// spec.proxy.basicAuth names cannot be read, so the template hash is unknown; the pool
	// creates and deletes nothing until it can be read.
	PoolReasonCredentialsUnavailable = "CredentialsUnavailable"
	PoolReasonPlacementValid         = "Valid"
	PoolReasonUnknownProvider        = "UnknownProvider"
	PoolReasonUnknownZone            = "UnknownZone"
	// PoolReasonSharedEgressIP (EgressShared=True): the message names each shared
	// address and the children leaving from it.
	PoolReasonSharedEgressIP = "SharedEgressIP"
	// PoolReasonDistinctEgressIPs (EgressShared=False): no two available children share
	// a known egress address.
	PoolReasonDistinctEgressIPs = "DistinctEgressIPs"
	// PoolReasonNoFreeEgress (EgressExhausted=True): the message says how many
	// configurations the selector matches, how many are free and how many are needed.
	PoolReasonNoFreeEgress = "NoFreeEgress"
	// PoolReasonEgressAvailable (EgressExhausted=False): every child the pool wants has
	// a configuration of its own.
	PoolReasonEgressAvailable = "EgressAvailable"
)

// PoolDeletionOrder says which children go first when a pool has more than it needs.
// +kubebuilder:validation:Enum=Random;Newest;Oldest
type PoolDeletionOrder string

const (
	DeletionOrderRandom PoolDeletionOrder = "Random"
	DeletionOrderNewest PoolDeletionOrder = "Newest"
	DeletionOrderOldest PoolDeletionOrder = "Oldest"
)

// ProxyTemplateMetadata is the metadata every child Proxy gets.
type ProxyTemplateMetadata struct {
	// Labels of each child, besides the pool and template-hash labels the pool sets.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations of each child.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ProxyTemplate is what each child Proxy is made from.
type ProxyTemplate struct {
	// +optional
	Metadata ProxyTemplateMetadata `json:"metadata,omitempty"`
	// Spec of each child; a spread entry may set its provider and zone.
	// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode == 'Managed'",message="spec.template.spec.mode must be Managed: a pool creates its proxies"
	// +required
	Spec ProxySpec `json:"spec"`
}

// PoolSpreadEntry is one place children go to.
// +kubebuilder:validation:XValidation:rule="(has(self.provider) && size(self.provider) > 0) || (has(self.zone) && size(self.zone) > 0)",message="a spread entry must set provider, zone or both"
type PoolSpreadEntry struct {
	// Provider overrides the template's spec.provider.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Provider string `json:"provider,omitempty"`
	// Zone overrides the template's spec.placement.zone (kvm2: a host name).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Zone string `json:"zone,omitempty"`
	// Weight is this entry's share of the children relative to the other entries.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Weight int32 `json:"weight,omitempty"`
}

// PoolRollingUpdate bounds a rollout, as in a Deployment or a cluster-api
// MachineDeployment: a number or a percentage of replicas (surge rounds up,
// unavailability rounds down).
type PoolRollingUpdate struct {
	// MaxSurge is how many children beyond replicas may exist during a rollout.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="maxSurge must be a non-negative number or a percentage such as 25%"
	// +optional
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`
	// MaxUnavailable is how many children below replicas may be unavailable during a
	// rollout, a rotation or a replacement.
	// +kubebuilder:default=0
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="maxUnavailable must be a non-negative number or a percentage such as 25%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// PoolStrategy says how children are replaced.
type PoolStrategy struct {
	// +kubebuilder:default={}
	// +optional
	RollingUpdate PoolRollingUpdate `json:"rollingUpdate,omitempty"`
}

// PoolRotation replaces children by age.
type PoolRotation struct {
	// MaxAge is the longest a child lives; it is replaced surge-first once past its
	// deadline. Empty: no rotation.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="rotation.maxAge must be a positive duration such as 6h"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
	// Jitter brings each child's deadline forward by its own share of up to this
	// percentage of maxAge, so children made together do not expire together.
	// +kubebuilder:validation:Pattern=`^([0-9]|[1-9][0-9]|100)%$`
	// +optional
	Jitter string `json:"jitter,omitempty"`
}

// PoolDeletion says which children are deleted first.
type PoolDeletion struct {
	// Order among children that are neither cordoned nor unhealthy (those go first).
	// +kubebuilder:default=Oldest
	// +optional
	Order PoolDeletionOrder `json:"order,omitempty"`
}

// PoolService names the selector-less Service (and its EndpointSlice) through which the
// pool publishes its healthy children.
type PoolService struct {
	// Name of the Service, in the pool's namespace.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
}

// ProxyPoolSpec is what the user asks for.
// +kubebuilder:validation:XValidation:rule="!((type(self.strategy.rollingUpdate.maxSurge) == int ? self.strategy.rollingUpdate.maxSurge == 0 : self.strategy.rollingUpdate.maxSurge == '0%') && (type(self.strategy.rollingUpdate.maxUnavailable) == int ? self.strategy.rollingUpdate.maxUnavailable == 0 : self.strategy.rollingUpdate.maxUnavailable == '0%'))",message="spec.strategy.rollingUpdate: maxSurge and maxUnavailable cannot both be 0: nothing could ever be replaced"
// +kubebuilder:validation:XValidation:rule="(has(self.template.spec.provider) && size(self.template.spec.provider) > 0) || (has(self.spread) && size(self.spread) > 0 && self.spread.all(e, has(e.provider) && size(e.provider) > 0))",message="spec.template.spec.provider is required unless every spread entry sets a provider"
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || !has(self.egress.wireguard) || (has(self.template.spec.proxy) && has(self.template.spec.proxy.allowedSourceRanges) && size(self.template.spec.proxy.allowedSourceRanges) > 0)",fieldPath=".egress.wireguard",message="needs spec.template.spec.proxy.allowedSourceRanges: each child gets a spec.proxy (its WireGuard configuration), and a Managed Proxy with spec.proxy must list the networks the crawlers and the operator's probes come from"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.proxy) || !has(self.template.spec.proxy.egress) || !has(self.template.spec.proxy.egress.wireguard)",fieldPath=".template.spec.proxy.egress.wireguard",message="is set: every child would use the same WireGuard configuration, and two peers with one key break each other's tunnel; give each standalone Proxy a Secret of its own instead"
type ProxyPoolSpec struct {
	// Replicas is how many child Proxies the pool keeps.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Template is what each child is made from. A change is rolled out by creating new
	// children and deleting old ones; a child's spec is never edited.
	// +required
	Template ProxyTemplate `json:"template"`
	// Spread lists where children go, round-robin by weight. Empty: the template's own
	// provider and zone.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Spread []PoolSpreadEntry `json:"spread,omitempty"`
	// +kubebuilder:default={}
	// +optional
	Strategy PoolStrategy `json:"strategy,omitempty"`
	// +optional
	Rotation PoolRotation `json:"rotation,omitempty"`
	// MinReadySeconds is how long a new child must be Ready before it counts as available.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`
	// ProgressDeadlineSeconds is, as in a Deployment, how long a rollout or a scale may go
	// without progress (no child becoming available, none finishing its deletion) before
	// the pool reports Progressing=False with reason ProgressDeadlineExceeded; and how
	// long a new child may take to become Ready before it is replaced as stuck.
	// +kubebuilder:default=600
	// +kubebuilder:validation:XValidation:rule="self > 0",message="spec.progressDeadlineSeconds must be a positive number of seconds (default 600)"
	// +optional
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
	// +kubebuilder:default={}
	// +optional
	Deletion PoolDeletion `json:"deletion,omitempty"`
	// Service, when set, publishes the healthy children as the EndpointSlice of a
	// selector-less Service the pool owns.
	// +optional
	Service *PoolService `json:"service,omitempty"`
	// Bans tunes how the children cool down after crawlers report bans (POST
	// /v1/feedback). Unset fields take the manager's flags.
	// +optional
	Bans *PoolBans `json:"bans,omitempty"`
	// Egress hands each child an exit of its own.
	// +optional
	Egress *PoolEgress `json:"egress,omitempty"`
	// Remediation is the pool's brake on remediation: its children's own timeouts are in
	// spec.template.spec.remediation (docs/health.md, "Remediation").
	// +optional
	Remediation *PoolRemediation `json:"remediation,omitempty"`
	// Autoscaling sizes the pool from its measured demand: the autoscaler then writes
	// spec.replicas (docs/pools.md, "Autoscaling").
	// +optional
	Autoscaling *PoolAutoscaling `json:"autoscaling,omitempty"`
	// Budget caps what the pool may cost per hour: the autoscaler grows it no further.
	// +optional
	Budget *PoolBudget `json:"budget,omitempty"`
}

// PoolRemediation is a pool's brake on remediation.
type PoolRemediation struct {
	// MaxUnhealthy: when more of the pool's children than this are past their boot or
	// unhealthy timeout at once, none of them is rebooted or replaced (that is a host,
	// network or probe-target outage, not bad VMs) until the count is back within it.
	// A count such as 2 or a percentage of the pool's children such as 40% (rounded up).
	// Default: the manager's --max-unhealthy (40%).
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$') && int(self.replace('%', '')) <= 100",message="spec.remediation.maxUnhealthy must be a count of children (0 or more) or a percentage from 0% to 100%, such as 40%"
	// +optional
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
}

// PoolEgress says how a pool's children leave.
type PoolEgress struct {
	// WireGuard gives each child one WireGuard configuration of its own.
	// +optional
	WireGuard *PoolWireGuard `json:"wireguard,omitempty"`
}

// PoolWireGuard hands the pool's children WireGuard configurations from a set of Secrets.
type PoolWireGuard struct {
	// SecretSelector selects the WireGuard Secrets of the pool's namespace (each opted in
	// with egress.hrajfrisbee.cz/proxy-credentials: "true" and holding wg0.conf, and
	// optionally egressIP, as for spec.proxy.egress.wireguard.secretRef). Each new child
	// is given one no other child of the pool holds, recorded in its
	// spec.proxy.egress.wireguard.assignedSecretRef; with none free the pool makes no
	// child and says so in EgressExhausted. The template must set
	// spec.proxy.allowedSourceRanges.
	// +required
	SecretSelector metav1.LabelSelector `json:"secretSelector"`
}

// PoolBans tunes the cooldowns of a pool's children and discovery's guard against
// handing the last few of them to a site that bans the rest.
type PoolBans struct {
	// CooldownSeconds is a first ban's cooldown; each further ban of the same proxy on
	// the same site doubles it, up to MaxCooldownSeconds. Default: --ban-cooldown (5m).
	// +kubebuilder:validation:Minimum=1
	// +optional
	CooldownSeconds *int32 `json:"cooldownSeconds,omitempty"`
	// MaxCooldownSeconds caps the doubling. Default: --ban-max-cooldown (24h).
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxCooldownSeconds *int32 `json:"maxCooldownSeconds,omitempty"`
	// MaxCoolingPercent: when more than this share of the children matching a discovery
	// request with ?pool= and ?domain= are cooling for that site, the answer is 503 with
	// Retry-After rather than the last few proxies. Default: --ban-max-cooling-percent (50).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxCoolingPercent *int32 `json:"maxCoolingPercent,omitempty"`
	// RetireAfterSites: a child reported banned on at least this many distinct sites
	// within RetireWindowSeconds is retired: cordoned (and so replaced, surge-first).
	// 0 turns retirement off. Default: --ban-retire-after-sites (5).
	// +kubebuilder:validation:XValidation:rule="self >= 0 && self <= 100",message="spec.bans.retireAfterSites must be 0 (off) to 100 (a proxy keeps at most 100 sites)"
	// +optional
	RetireAfterSites *int32 `json:"retireAfterSites,omitempty"`
	// RetireWindowSeconds is how far back the bans counted by RetireAfterSites reach.
	// Default: --ban-retire-window (1h).
	// +kubebuilder:validation:XValidation:rule="self > 0",message="spec.bans.retireWindowSeconds must be a positive number of seconds (default 3600)"
	// +optional
	RetireWindowSeconds *int32 `json:"retireWindowSeconds,omitempty"`
	// MaxRetirementsPerHour is the retirement budget: at most this many children are
	// retired within any hour, a number or a percentage of spec.replicas rounded up (10%
	// of 3 is 1). A child due for retirement past it is held back: it keeps serving,
	// cooling for each site it was banned on, and is retired once the budget frees if it
	// is still due then. 0 holds every retirement back. Default:
	// --ban-max-retirements-per-hour (10%).
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 1000 : self.matches('^[0-9]{1,3}%$')",message="spec.bans.maxRetirementsPerHour must be a number from 0 to 1000 or a percentage of spec.replicas such as 10%"
	// +optional
	MaxRetirementsPerHour *intstr.IntOrString `json:"maxRetirementsPerHour,omitempty"`
}

// PoolRetirements is the retirement budget at work: how many children the last hour's
// retirements took and what waits for it.
type PoolRetirements struct {
	// PerHour is the budget: spec.bans.maxRetirementsPerHour for spec.replicas.
	PerHour int32 `json:"perHour"`
	// Recent are the children retired within the last hour, oldest first; the budget is
	// spent when there are PerHour of them. A restarted manager counts from here.
	// +listType=atomic
	// +optional
	Recent []PoolRetirement `json:"recent,omitempty"`
	// HeldBack counts the children due for retirement that the spent budget holds back:
	// they keep serving, cooling for each site they were banned on.
	// +optional
	HeldBack int32 `json:"heldBack,omitempty"`
	// NextFreeAt is when the oldest of Recent leaves the hour, freeing one retirement;
	// set while children are held back by a budget that is not 0.
	// +optional
	NextFreeAt *metav1.Time `json:"nextFreeAt,omitempty"`
}

// PoolRetirement is one retirement a pool's budget counts.
type PoolRetirement struct {
	// Proxy is the retired child's name.
	Proxy string `json:"proxy"`
	// At is when it was retired.
	At metav1.Time `json:"at"`
}

// ProxyPoolStatus is what the controller observed.
type ProxyPoolStatus struct {
	// Replicas is the number of children, being deleted or not.
	// +optional
	Replicas int32 `json:"replicas"`
	// ReadyReplicas counts children whose proxy is Ready (healthy).
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// AvailableReplicas counts children Ready for at least minReadySeconds and not
	// cordoned.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`
	// UpToDateReplicas counts children made from the current template.
	// +optional
	UpToDateReplicas int32 `json:"upToDateReplicas"`
	// SaturatedSites counts the sites for which more of the serving children are cooling
	// than spec.bans.maxCoolingPercent allows (the Saturated condition names the worst).
	// Written by the leader under the proxy-bans field manager.
	// +optional
	SaturatedSites int32 `json:"saturatedSites,omitempty"`
	// Retirements is the retirement budget at work (spec.bans.maxRetirementsPerHour);
	// absent while retirement is off. Written by the leader under the proxy-bans field
	// manager.
	// +optional
	Retirements *PoolRetirements `json:"retirements,omitempty"`
	// Selector selects the children, as a label selector string (for the scale
	// subresource and a HorizontalPodAutoscaler).
	// +optional
	Selector string `json:"selector,omitempty"`
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastProgressTime is when the pool last saw progress: a child becoming available or
	// finishing its deletion, a spec change, or the pool complete. Progressing turns False
	// (ProgressDeadlineExceeded) progressDeadlineSeconds after it while the pool is not
	// complete.
	// +optional
	LastProgressTime *metav1.Time `json:"lastProgressTime,omitempty"`
	// DistinctEgressIPs counts the distinct egress addresses (status.egressIP, the
	// address the health probe's target saw) among the available children. A child
	// whose address is not known yet is not counted.
	// +optional
	DistinctEgressIPs int32 `json:"distinctEgressIPs"`
	// Cost is the sum of the costs of the children not being deleted, in their one
	// currency; absent while one of them has an instance without a price, or when their
	// prices are in more than one currency. Written under the egress-proxies-cost field
	// manager.
	// +optional
	Cost *Cost `json:"cost,omitempty"`
	// Autoscaling is the demand the autoscaler acted on and what it decided (with
	// spec.autoscaling). Written under the egress-proxies-autoscaler field manager.
	// +optional
	Autoscaling *PoolAutoscalingStatus `json:"autoscaling,omitempty"`
	// Conditions: Available, Progressing, PlacementValid, EgressShared, (with
	// spec.egress.wireguard) EgressExhausted and (with spec.autoscaling) Scaling.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProxyPool keeps a number of Proxies made from one template, spread over providers and
// zones, rolled and rotated surge-first.
// The pool's name is the value of its children's pool label, and a label value has at
// most 63 characters.
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name of a ProxyPool must be at most 63 characters: it is the value of its children's egress.hrajfrisbee.cz/pool label, and label values are limited to 63"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=ppool,categories=egress
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Up-To-Date",type=integer,JSONPath=`.status.upToDateReplicas`
// +kubebuilder:printcolumn:name="Egress IPs",type=integer,JSONPath=`.status.distinctEgressIPs`,description="Distinct egress addresses among the available children"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].reason`,priority=1,description="The Progressing condition's reason: why a stalled pool cannot proceed (Stalled, ProgressDeadlineExceeded, CredentialsUnavailable, ...)"
// +kubebuilder:printcolumn:name="Demand",type=string,JSONPath=`.status.autoscaling.demand.sessions`,priority=1,description="The concurrent sessions the autoscaler acted on"
// +kubebuilder:printcolumn:name="Scaling",type=string,JSONPath=`.status.conditions[?(@.type=="Scaling")].reason`,priority=1,description="The Scaling condition's reason: what the autoscaler did last, or why it stands aside"
// +kubebuilder:printcolumn:name="Cost/h",type=string,JSONPath=`.status.cost.hourly`,priority=1,description="What the pool's children cost per hour together (status.cost, in status.cost.currency)"
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ProxyPoolSpec   `json:"spec"`
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// ProxyPoolList is a list of ProxyPools.
// +kubebuilder:object:root=true
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyPool `json:"items"`
}

func init() {
	register(&ProxyPool{}, &ProxyPoolList{})
}
