package kvm2

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// The reasons a host's health check reports: where the check broke, or Reachable.
const (
	reasonReachable              = "Reachable"
	reasonCredentialsUnavailable = "CredentialsUnavailable"
	reasonUnreachable            = "Unreachable"
	reasonUnauthorized           = "Unauthorized"
	reasonForbidden              = "Forbidden"
	reasonTimeout                = "Timeout"
	reasonPoolNotFound           = "PoolNotFound"
	reasonPoolNotActive          = "PoolNotActive"
	reasonAPIError               = "APIError"
)

// check probes every configured host concurrently and returns their statuses in config
// order.
func (hs *hosts) check(ctx context.Context) []provider.TargetStatus {
	out := make([]provider.TargetStatus, len(hs.cfg.Hosts))
	var wg sync.WaitGroup
	for i, h := range hs.cfg.Hosts {
		wg.Go(func() { out[i] = hs.probeHost(ctx, h) })
	}
	wg.Wait()
	return out
}

// probeHost checks one host on a connection of its own, never the pooled one: a check
// that runs out of time kills only that connection, and the fresh dial reads the
// credentials as they are now. The details gain each fact as it arrives, so a check that
// fails late still shows what the host answered.
func (hs *hosts) probeHost(ctx context.Context, h provider.KVMHost) provider.TargetStatus {
	start := time.Now()
	st := provider.TargetStatus{Target: h.Name, Details: map[string]string{"user": h.User, "pool": h.Pool}}
	closeFn, err := hs.probe(ctx, h, st.Details)
	st.Latency = time.Since(start)
	if closeFn != nil {
		closeFn()
	}
	st.Ready = err == nil
	st.Reason = checkReason(ctx, err)
	kv := []any{"host", h.Name, "ready", st.Ready, "reason", st.Reason, "latency", st.Latency}
	if err != nil {
		st.Message = err.Error()
		kv = append(kv, "error", st.Message)
	}
	tracing.Logger(ctx, hs.log).V(1).Info("kvm2 host checked", kv...)
	return st
}

// probe runs the check's sequence: dial, ConnectGetLibVersion, ConnectGetHostname,
// StoragePoolLookupByName and StoragePoolGetInfo. The caller closes the connection.
func (hs *hosts) probe(ctx context.Context, h provider.KVMHost, details map[string]string) (func(), error) {
	b, closeFn, err := hs.dialFresh(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	v, err := b.ConnectGetLibVersion()
	if err != nil {
		return closeFn, fmt.Errorf("libvirt version of host %s: %w", h.Name, err)
	}
	details["libvirtVersion"] = fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
	name, err := b.ConnectGetHostname()
	if err != nil {
		return closeFn, fmt.Errorf("hostname of host %s: %w", h.Name, err)
	}
	details["hostname"] = name
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		return closeFn, fmt.Errorf("storage pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	state, capacity, _, available, err := b.StoragePoolGetInfo(pool)
	if err != nil {
		return closeFn, fmt.Errorf("storage pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	details["poolState"] = poolStateName(state)
	details["poolCapacityGiB"] = gib(capacity)
	details["poolAvailableGiB"] = gib(available)
	if libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning {
		return closeFn, provider.Permanent(&poolStateError{pool: h.Pool, host: h.Name, state: poolStateName(state)})
	}
	return closeFn, nil
}

// poolStateError is a pool that exists but is not running.
type poolStateError struct{ pool, host, state string }

func (e *poolStateError) Error() string {
	return fmt.Sprintf("storage pool %s on host %s is not running (state %s)", e.pool, e.host, e.state)
}

func gib(bytes uint64) string {
	return strconv.FormatFloat(float64(bytes)/(1<<30), 'f', 1, 64)
}

// checkReason says where a check broke. A round that ran out of time is Timeout whatever
// it was doing; otherwise the dial stage, the libvirt code or the budget decides.
func checkReason(ctx context.Context, err error) string {
	if err == nil {
		return reasonReachable
	}
	if ctx.Err() != nil {
		return reasonTimeout
	}
	var pse *poolStateError
	if errors.As(err, &pse) {
		return reasonPoolNotActive
	}
	var de *dialError
	if errors.As(err, &de) {
		switch de.stage {
		case stageCredentials:
			return reasonCredentialsUnavailable
		case stageSSH:
			if sshRefused(err) {
				return reasonUnauthorized
			}
			return reasonUnreachable
		case stageTCP:
			return reasonUnreachable
		}
		// At the socket stage a libvirt error is libvirt refusing the user or failing;
		// anything else is the forwarding refused or the link gone.
		if _, ok := libvirtCode(err); !ok {
			return reasonUnreachable
		}
	}
	if code, ok := libvirtCode(err); ok {
		switch code {
		case libvirt.ErrAccessDenied, libvirt.ErrAuthFailed:
			return reasonForbidden
		case libvirt.ErrNoStoragePool:
			return reasonPoolNotFound
		}
		return reasonAPIError
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// The connection was up and an RPC's own budget ran out.
		return reasonTimeout
	}
	// The link died mid-check.
	return reasonUnreachable
}
