package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PoolConditionScaling is the built-in autoscaler's condition on a pool with
// spec.autoscaling (absent without it): True while the autoscaler sizes the pool (its
// reason says what it did last: ScaledUp, ScaledDown, WithinTarget, HeldByDelay,
// HeldByStep, BudgetCapped, DemandUnknown), False while it stands aside
// (ExternalAutoscaler: an HPA or a KEDA ScaledObject drives the pool) or cannot
// (InvalidSpec). Its message names the numbers.
const PoolConditionScaling = "Scaling"

// Reasons of the Scaling condition.
const (
	// PoolReasonScaledUp: spec.replicas was raised toward what the demand wants.
	PoolReasonScaledUp = "ScaledUp"
	// PoolReasonScaledDown: spec.replicas was lowered, after the scale-down delay, or at
	// once above maxReplicas.
	PoolReasonScaledDown = "ScaledDown"
	// PoolReasonWithinTarget: the pool has what the demand wants.
	PoolReasonWithinTarget = "WithinTarget"
	// PoolReasonHeldByDelay: the demand wants fewer, and the scale-down delay has not
	// passed yet.
	PoolReasonHeldByDelay = "HeldByDelay"
	// PoolReasonHeldByStep: the demand wants more, and the last step up is not available
	// yet (maxStepUp).
	PoolReasonHeldByStep = "HeldByStep"
	// PoolReasonBudgetCapped: spec.budget.maxHourly caps the pool below what the demand
	// wants; the message names the cap.
	PoolReasonBudgetCapped = "BudgetCapped"
	// PoolReasonExternalAutoscaler: a HorizontalPodAutoscaler or a KEDA ScaledObject
	// targets the pool; the message names it, and the built-in autoscaler stands aside.
	PoolReasonExternalAutoscaler = "ExternalAutoscaler"
	// PoolReasonDemandUnknown: no measurer reported the pool's demand within the last 2
	// minutes; the pool keeps its size.
	PoolReasonDemandUnknown = "DemandUnknown"
	// PoolReasonInvalidSpec: spec.autoscaling or spec.budget cannot be acted on; the
	// message says why.
	PoolReasonInvalidSpec = "InvalidSpec"
)

// PoolAutoscaling sizes a pool from its measured demand (docs/pools.md, "Autoscaling").
// The autoscaler writes spec.replicas: leave it out of the pool's manifest.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="spec.autoscaling.minReplicas must not be more than maxReplicas"
type PoolAutoscaling struct {
	// MinReplicas is the fewest children the pool keeps, idle or not; 0 lets an idle
	// pool go to zero. Default 0.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// MaxReplicas is the most children the pool grows to.
	// +kubebuilder:validation:Minimum=1
	// +required
	MaxReplicas int32 `json:"maxReplicas"`
	// Target is the load one available child is meant to carry.
	// +required
	Target PoolAutoscalingTarget `json:"target"`
	// WarmSpare children are kept beyond what the demand needs while there is any
	// demand, so that a burst does not wait for a boot. Default 0.
	// +kubebuilder:validation:Minimum=0
	// +optional
	WarmSpare int32 `json:"warmSpare,omitempty"`
	// ScaleDownDelay is how long the demand must want fewer children before the pool
	// shrinks, and the least time between a scale-down and any other change. Default 5m.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="spec.autoscaling.scaleDownDelay must not be negative"
	// +optional
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`
	// MaxStepUp bounds a scale-up as maxSurge bounds a rollout: at most this many
	// children (or this percentage of spec.replicas, rounded up; at least 1) beyond those
	// available. Default 100%.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="spec.autoscaling.maxStepUp must be a non-negative number or a percentage such as 100%"
	// +optional
	MaxStepUp *intstr.IntOrString `json:"maxStepUp,omitempty"`
}

// PoolAutoscalingTarget is the load per available child. With both set, the pool is sized
// for whichever needs more children.
// +kubebuilder:validation:XValidation:rule="has(self.sessionsPerReplica) || has(self.requestsPerSecondPerReplica)",message="spec.autoscaling.target must set sessionsPerReplica, requestsPerSecondPerReplica or both"
type PoolAutoscalingTarget struct {
	// SessionsPerReplica is the concurrent sessions (open tunnels, live sessions and
	// requests held waiting for a child) one child carries.
	// +kubebuilder:validation:Minimum=1
	// +optional
	SessionsPerReplica *int32 `json:"sessionsPerReplica,omitempty"`
	// RequestsPerSecondPerReplica is the requests per second one child carries.
	// +kubebuilder:validation:Minimum=1
	// +optional
	RequestsPerSecondPerReplica *int32 `json:"requestsPerSecondPerReplica,omitempty"`
}

// PoolBudget caps what a pool spends.
type PoolBudget struct {
	// MaxHourly is the most the pool may cost per hour, in the currency of the prices in
	// the providers config. The autoscaler grows the pool to no more than
	// floor(maxHourly / a child's hourly cost) children (never fewer than minReplicas).
	// +required
	MaxHourly Amount `json:"maxHourly"`
}

// PoolAutoscalingStatus is what the autoscaler acted on and decided, and what it keeps
// between passes.
type PoolAutoscalingStatus struct {
	// DesiredReplicas is the size the autoscaler decided on.
	DesiredReplicas int32 `json:"desiredReplicas"`
	// Demand is the measured demand it decided from.
	Demand PoolDemand `json:"demand"`
	// LastScaleUpTime and LastScaleDownTime are the autoscaler's last changes of
	// spec.replicas.
	// +optional
	LastScaleUpTime *metav1.Time `json:"lastScaleUpTime,omitempty"`
	// +optional
	LastScaleDownTime *metav1.Time `json:"lastScaleDownTime,omitempty"`
	// BelowSince is since when the demand has wanted fewer children than the pool has
	// (the start of the scale-down delay), and BelowPeak the most it wanted since then:
	// the size a scale-down goes to.
	// +optional
	BelowSince *metav1.Time `json:"belowSince,omitempty"`
	// +optional
	BelowPeak int32 `json:"belowPeak,omitempty"`
}

// PoolDemand is a pool's demand summed over its measurers' fresh reports.
type PoolDemand struct {
	// Sessions is the concurrent sessions (open tunnels, live sessions).
	Sessions resource.Quantity `json:"sessions"`
	// Held is the requests held waiting for a child.
	// +optional
	Held int32 `json:"held"`
	// RequestsPerSecond is the request rate.
	RequestsPerSecond resource.Quantity `json:"requestsPerSecond"`
	// Sources counts the measurers whose reports are fresh (at most 2 minutes old), and
	// StaleSources those left out as older.
	// +optional
	Sources int32 `json:"sources"`
	// +optional
	StaleSources int32 `json:"staleSources,omitempty"`
}
