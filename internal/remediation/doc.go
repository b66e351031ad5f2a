// Package remediation decides when a Managed Proxy whose VM never came up, or stopped
// answering, is rebooted or replaced, after cluster-api's MachineHealthCheck. It is a
// pure planner: Plan reads no clock (now is an argument), calls no API and no provider;
// a controller gathers the proxies' States (FromProxy), carries out the Decisions, and
// persists each proxy's Record.
//
// # When a proxy is due
//
//   - Boot timeout (reason BootTimeout): its instance has run (the Provisioned condition
//     True with reason InstanceRunning, since its last transition) for BootTimeout
//     (default 10m) and no probe has gone through it since.
//   - Unhealthy timeout (reason Unhealthy): it answered since its instance started, and
//     has been out of rotation (Healthy=False, since that condition's last transition)
//     for UnhealthyTimeout (default 5m).
//
// A proxy whose instance does not run (being built or replaced) has no clock; that is the
// reconciler's business. An External proxy, one being deleted, a Failed one (it waits
// for the user), a cordoned one (out of service on purpose; a pool replaces it anyway),
// and one whose probes show it leaving from the wrong address (EgressMismatch: a new VM
// would leave from the same exit) are never remediated.
//
// # What is done
//
// Each instance is rebooted once, where its provider can (State.CanReboot), before it is
// replaced; a provider without reboot has every attempt replace. After attempt n the
// proxy has Policy.Wait(n) (FirstWait 3m, doubled each attempt, at most MaxWait 30m) to be
// healthy again; if it is not when the wait ends (and, after a replacement, when its new
// instance's own boot timeout has passed too), the attempt failed and the next one
// follows. Once the proxy has been healthy for ResetAfter (10m) its Record is dropped and
// the attempt counted as a success, with the time from the fault's start to serving
// again; a later fault starts over from a reboot and the first wait.
//
// # The brake
//
// Every proxy belongs to a group: a pool's children (PoolGroup), or the standalone
// Proxies of one provider host or zone (HostGroup). A group's unhealthy members are those
// past their boot or unhealthy timeout (like MachineHealthCheck, a proxy still within its
// timeout is not counted). When more of them than maxUnhealthy (a count, or a percentage
// of the members rounded up; default 40%) are unhealthy, that is a host, network or
// probe-target outage rather than bad VMs, and remediation is held in the whole group
// (Remediating=False, reason TooManyUnhealthy, naming the counts); it resumes by itself
// once the count is back within maxUnhealthy.
//
// # The probe target
//
// While the probe target itself is known to be down (State.TargetDown), failed probes say
// nothing about the proxies: nothing is remediated (Remediating=False, reason
// ProbeTargetDown), and those proxies are not counted by the brake. When it answers
// again, every fault's clock starts no earlier than its return (State.TargetUpSince), so
// an outage of any length replaces nothing.
//
// # For the controller
//
// Gather the States of a whole group at once (FromProxy, then CanReboot from the
// provider, TargetDown and TargetUpSince from the health engine, the timeouts of the
// Proxy or its pool's template), Plan, SetRecord (the controller writes it before the
// action, carrying the version it read, so a pass that read a stale copy is refused
// before it acts), carry out each Action, SetCondition on the Proxy, record a Warning Event with the condition's reason and
// message for each action, count Concluded outcomes (ObserveConcluded) and the groups'
// brakes (ObserveGroup), and requeue at Result.Next. A pool replaces a child by a new
// Proxy: copying the Record to its successor keeps the attempt count and the growing
// waits; without it the successor starts over from a reboot and the first wait.
package remediation
