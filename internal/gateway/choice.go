package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Exit is one forward proxy the gateway can send a request or tunnel through.
type Exit struct {
	Namespace, Name string
	// Address is the exit's proxy listener, host:port.
	Address string
	// EgressIP is the address sites see the exit's traffic come from; empty when unknown.
	EgressIP string
	// User and Password are the exit's own basic-auth credentials, empty when it takes
	// none. The gateway sends them to the exit only; a client never sees them.
	User, Password string
	// Pool is the ProxyPool the exit belongs to, empty for a standalone proxy: a request
	// carried by it is that pool's demand, whether or not it named the pool.
	Pool string
}

// ID is namespace/name, the name crawlers report bans by and X-Egress-Proxy carries.
func (e Exit) ID() string { return e.Namespace + "/" + e.Name }

// Identity is who a credential belongs to and which namespaces it may use.
type Identity struct {
	// Name is for the log (a ServiceAccount's username, "static token").
	Name string
	// AllNamespaces: the credential may use every namespace.
	AllNamespaces bool
	// Namespaces the credential may use when AllNamespaces is false.
	Namespaces []string
}

// May says whether the identity may use exits in namespace ns.
func (id Identity) May(ns string) bool {
	if id.AllNamespaces {
		return true
	}
	for _, n := range id.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// ChoiceRequest is everything a Chooser needs to choose one exit.
type ChoiceRequest struct {
	// Identity is the authenticated caller: the Chooser returns only exits in namespaces
	// Identity.May allows.
	Identity Identity
	// Namespace, when not empty, limits the choice to that namespace (the gateway has
	// already checked that Identity may use it).
	Namespace string
	// Pool, when not empty, limits the choice to that ProxyPool's exits.
	Pool string
	// Provider, Region, Zone and Labels (a label selector), when not empty, limit the
	// choice as pick's ?provider=, ?region=, ?zone= and ?labelSelector= do.
	Provider, Region, Zone, Labels string
	// Session, when not empty, is the sticky key: the Chooser maps it to an exit by the
	// same rendezvous choice as discovery's pick?key=, so every replica agrees.
	Session string
	// Strict asks the Chooser not to move Session off its exit: when the exit the key
	// maps to is unavailable (or in Exclude), return an error wrapping
	// ErrSessionExitUnavailable that names it (UnavailableError).
	Strict bool
	// Rotation, used only without a Session, counts the choices this gateway made: the
	// Chooser orders the eligible exits' distinct egress addresses in a fixed order and
	// takes the Rotation-th (modulo their count), so consecutive requests leave from
	// distinct addresses.
	Rotation uint64
	// Site is the target host (no port, lower case): exits cooling for it are skipped,
	// as pick?domain= skips them.
	Site string
	// Exclude lists the IDs of exits that failed earlier in this request.
	Exclude []string
	// Family asks for an IPv4 or IPv6 egress address; FamilyAny takes either.
	Family Family
}

// Excludes says whether the exit with id is in r.Exclude.
func (r ChoiceRequest) Excludes(id string) bool {
	for _, x := range r.Exclude {
		if x == id {
			return true
		}
	}
	return false
}

// Chooser chooses the exit for one request or tunnel.
//
// Choose returns an exit the caller may use, or an error wrapping one of:
// ErrNoExit (nothing eligible: an empty pool, every exit excluded, unhealthy or of
// the other IP family; an *EmptyPoolError when the request names a pool that exists as a
// ProxyPool but has no eligible exit now, which the gateway holds the request for),
// ErrUnknownPool (the pool does not exist in the namespaces the identity may use; never
// ErrNoExit for that, since the pool label of the metrics is only kept for pools a
// Chooser knows),
// ErrSaturated (too many of the pool's exits are cooling for the site; a SaturatedError
// carries the site and when to come back), ErrSessionExitUnavailable (a strict session's
// exit is unavailable; an UnavailableError names it). Any other error is the Chooser's
// own failure and is answered as ErrNoExit is, with the error in the log.
type Chooser interface {
	Choose(ctx context.Context, req ChoiceRequest) (Exit, error)
}

// Authenticator verifies a caller's credential (the proxy password: a token the
// discovery API accepts). It returns the identity, or an error wrapping
// ErrBadCredentials when the credential is wrong; any other error means it could not
// tell (the API server did not answer) and the caller is told to try again later.
type Authenticator interface {
	Authenticate(ctx context.Context, user, password string) (Identity, error)
}

// Reporter takes what the gateway learns about exits. Its methods must not block: the
// gateway calls them on the request's path.
type Reporter interface {
	// Unreachable: the exit refused or timed out, or answered with its own failure.
	Unreachable(exit Exit, err error)
	// Banned: a site answered a plain-HTTP request through the exit with a status that
	// means banned or throttled (Config.BanStatuses); retryAfter is the site's
	// Retry-After, 0 when it sent none.
	Banned(exit Exit, site string, status int, retryAfter time.Duration)
}

// The error classes of a Chooser and of the gateway's own steps.
var (
	ErrNoExit                 = errors.New("no exit available")
	ErrUnknownPool            = errors.New("unknown pool")
	ErrSaturated              = errors.New("pool saturated for the site")
	ErrSessionExitUnavailable = errors.New("the strict session's exit is unavailable")
	ErrBadCredentials         = errors.New("bad credentials")
	ErrExitFailed             = errors.New("exit failed")
)

// SaturatedError is a Chooser's ErrSaturated with its details.
type SaturatedError struct {
	Site       string
	RetryAfter time.Duration
}

func (e *SaturatedError) Error() string {
	return fmt.Sprintf("too many exits are cooling for site %s; retry after %s", e.Site, e.RetryAfter)
}

// Is makes errors.Is(err, ErrSaturated) true.
func (e *SaturatedError) Is(target error) bool { return target == ErrSaturated }

// EmptyPoolError is a Chooser's ErrNoExit for a request naming a pool that exists (a
// ProxyPool in Namespace the identity may use) but has no eligible exit now: at zero
// children, or none of them Ready yet. The gateway holds such a request for an exit
// (Config.ActivationTimeout) and counts it as the pool's held demand.
type EmptyPoolError struct {
	Namespace, Pool string
	// Reason says why nothing is eligible, for the log.
	Reason string
}

func (e *EmptyPoolError) Error() string {
	return fmt.Sprintf("pool %s/%s has no eligible exit now: %s", e.Namespace, e.Pool, e.Reason)
}

// Is makes errors.Is(err, ErrNoExit) true.
func (e *EmptyPoolError) Is(target error) bool { return target == ErrNoExit }

// PoolDemand is the gateway's demand on one pool, as this replica measures it.
type PoolDemand struct {
	Namespace, Pool string
	// Sessions is the pool's open tunnels plus its live sessions (those used within their
	// sesstime); Held the requests held waiting for one of its exits.
	Sessions, Held int
	// RequestsPerSecond is the rate of requests and tunnels the gateway took for the
	// pool over the last measuring interval.
	RequestsPerSecond float64
}

// DemandRecorder takes the gateway's demand per pool: on every change of a pool's held
// requests at once (so that a first held request wakes the pool), and every measuring
// interval for every pool with demand, and once more with all zero when it has none
// left. Record must not block: the gateway calls it on the request's path.
type DemandRecorder interface {
	Record(d PoolDemand)
}

// UnavailableError is ErrSessionExitUnavailable naming the exit.
type UnavailableError struct {
	Exit   string // namespace/name
	Reason string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("the strict session's exit %s is unavailable: %s", e.Exit, e.Reason)
}

// Is makes errors.Is(err, ErrSessionExitUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrSessionExitUnavailable }
