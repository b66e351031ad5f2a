// Package framework is what the real-host test tiers (test/e2e, test/deploy) share: the
// libvirt host they drive (its environment, virsh over SSH or locally, what an instance
// leaves behind), waiting on a Proxy, the probe target that tells which address a request
// came from, and requests through a guest's proxy. Each tier keeps only its own story.
//
// It is an ordinary package (no build tag), so `go vet ./...` and the unit tests keep it
// compiling and checked even though the tiers using it run only on a prepared host.
package framework
