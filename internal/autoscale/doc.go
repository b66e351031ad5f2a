// Package autoscale sizes a ProxyPool from its measured demand. It is a pure decision
// core, like the pool's planner and remediation's: Decide reads no clock (Input.Now),
// calls no API, and returns its Decision as data: the desired replicas, a reason (a
// CamelCase word for a condition), a message naming the numbers, when to look again,
// and the State the controller keeps for the next pass.
//
// # The target: sessions, and requests per second
//
// The load one available child is meant to carry (Target) is counted two ways, and the
// pool is sized for whichever needs more children:
//
//   - Concurrent sessions (open tunnels, live sessions, requests held waiting for a
//     child). This is the primary measure: a proxy child's limits are its open
//     connections (file descriptors, memory, the VM's bandwidth shared between them),
//     and a CONNECT tunnel for HTTPS is one long session whose requests the gateway
//     never sees, so requests per second would count a busy tunnel as idle.
//   - Requests per second, for plain-HTTP traffic the gateway does see. It bounds the
//     rate each exit address sends, which is what sites ban addresses for: a pool sized
//     by requests per second spreads a crawl's rate over enough addresses.
//
// # Demand
//
// The demand is a list of Samples, one per measurer (each gateway replica, discovery's
// picks), each with the time it was measured. Of each source only the newest sample
// counts; samples older than StaleAfter (DefaultStaleAfter, 2m) are ignored, so that a
// gateway replica that is gone stops counting. The fresh ones are summed. With none
// fresh the demand is unknown and the pool keeps its size (DemandUnknown): a silent
// measurer is not an idle pool. A pool for which no measurer holds a record at all
// (Input.Idle: none has ever seen demand for it, or its records were collected long
// after they went stale) has a demand of zero instead, so that a new pool nobody uses
// goes down to MinReplicas.
//
// # The rules
//
// The pool wants ceil(demand/target) children, plus WarmSpare when that is more than 0
// (children kept beyond the demand so that a burst does not wait for a boot), never
// fewer than MinReplicas (0 allowed) and never more than MaxReplicas or the budget.
//
//   - Up at once, in bounded steps: at most MaxStepUp (a count, or a percentage of the
//     replicas rounded up, at least 1; default 100%) children beyond those available, like
//     a rollout's maxSurge, so that a pool whose children fail to boot does not keep
//     adding (HeldByStep). A pool below MinReplicas is raised to it in one step, as a
//     rollout creates a scale-up's children at once. From zero, any demand (one held request) gives at least one
//     child at once.
//   - Down only after the pool has wanted fewer for ScaleDownDelay (default
//     DefaultScaleDownDelay, 5m) and ScaleDownDelay after its last change, and then to
//     the most it wanted in that time (HeldByDelay meanwhile, ScaledDown): at most one
//     scale-down per delay window, so a steady or noisy demand does not make it
//     oscillate, and never below the warm spare while there is demand.
//   - The budget (Budget: a maximum per hour and a child's cost per hour) caps the pool
//     at floor(maxHourly/cost) children, never below MinReplicas; when it binds the
//     reason is BudgetCapped and the message names the cap. A pool above MaxReplicas or
//     the budget (lowered since) shrinks at once.
//   - With an external autoscaler (an HPA or a KEDA ScaledObject on the pool's scale
//     subresource) on, nothing is decided (Decided false, ExternalAutoscaler): the two
//     never fight.
//
// # For the controller
//
// Gather the Input (the pool's spec.autoscaling, its replicas and available children, the
// demand samples shared through the API server, the costs from the providers config, the
// State kept in the pool's status), Decide, write Decision.Replicas when Decided, keep
// Decision.State, set a condition from Reason and Message, and requeue at Decision.Next.
package autoscale
