package kvm2

import (
	"context"
	"testing"
)

// Transport benchmarks over the in-process SSH server and the wire-level libvirt fake:
// what a dial costs, and what an RPC costs on the pooled connection against one on a
// connection dialled for it (the health check's pattern).

// BenchmarkDialSSHLibvirt: TCP connect, SSH handshake, forwarded socket and libvirt
// connect, then the courtesy close.
func BenchmarkDialSSHLibvirt(b *testing.B) {
	e := newTestEnv(b, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	h := must(e.hs.host(e.host))
	ctx := context.Background()
	for b.Loop() {
		c, err := e.hs.dial(ctx, h)
		if err != nil {
			b.Fatal(err)
		}
		c.close(e.hs.budgets)
	}
}

// BenchmarkRPCPooled: one ConnectGetHostname round trip on the shared connection.
func BenchmarkRPCPooled(b *testing.B) {
	e := newTestEnv(b, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	ctx := context.Background()
	be := must(e.hs.pooled(ctx, e.host))
	must(be.ConnectGetHostname())
	for b.Loop() {
		if _, err := be.ConnectGetHostname(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRPCFresh: the same RPC on a connection dialled for it and closed after.
func BenchmarkRPCFresh(b *testing.B) {
	e := newTestEnv(b, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	ctx := context.Background()
	for b.Loop() {
		be, closeFn, err := e.hs.dialFresh(ctx, e.host)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := be.ConnectGetHostname(); err != nil {
			b.Fatal(err)
		}
		closeFn()
	}
}
