package common

// Event actions (the events API's "what was being done").
const (
	ActionReconcile = "Reconcile"
	ActionCreate    = "Create"
	ActionGet       = "Get"
	ActionDelete    = "Delete"
	ActionList      = "List"
)

// RemediationReplaceAnnotation marks a pool child that remediation handed to its pool to
// be replaced; its value is the time of the attempt. The pool creates a successor (which
// inherits the child's remediation record) and retires the child once the successor is
// available, within maxSurge and maxUnavailable.
const RemediationReplaceAnnotation = "egress.hrajfrisbee.cz/remediation-replace"

// ReasonAttemptsExhausted is the Remediating condition's reason (False) once
// spec.remediation.maxAttempts attempts have not mended the proxy: it is Stalled.
const ReasonAttemptsExhausted = "AttemptsExhausted"

// The remediation brake's condition, written by the pool reconciler on a ProxyPool and
// by the Proxy reconciler on a ProviderHealth.
const (
	// PoolConditionRemediationAllowed is False (reason TooManyUnhealthy) while more of
	// the pool's children than maxUnhealthy are past their boot or unhealthy timeout and
	// remediation is held in the pool, True (reason WithinMaxUnhealthy) otherwise; the
	// message names the counts.
	PoolConditionRemediationAllowed = ConditionRemediationAllowed
	// ConditionRemediationAllowed is the brake's condition on a ProxyPool (its children)
	// and on a ProviderHealth (the provider's standalone Proxies, by zone).
	ConditionRemediationAllowed  = "RemediationAllowed"
	PoolReasonWithinMaxUnhealthy = "WithinMaxUnhealthy"
	// EventRemediationResumed: the brake released.
	EventRemediationResumed = "RemediationResumed"
)
