// Package libvirtfake is a stateful in-memory libvirt daemon for the kvm2
// provider's tests, usable two ways:
//
//   - directly: *Fake has every method of kvm2's backend interface with
//     go-libvirt's own signatures, so a test hands it to the provider in place
//     of a *libvirt.Libvirt;
//   - over the wire: ServeConn speaks libvirt's remote protocol on a
//     net.Conn, so go-libvirt's real client (libvirt.NewWithDialer plus
//     ConnectToURI(libvirt.QEMUSystem)) runs against it, usually through the
//     in-process SSH server of package sshtest.
//
// # Building a test environment
//
// In memory:
//
//	f := libvirtfake.New() // hostname "fakehost", libvirt 9.0.0, pool "default"
//	var _ backend = f      // in package kvm2's tests
//
// Over the wire without a network (an in-memory pipe per connection):
//
//	l := libvirt.NewWithDialer(f) // *Fake is a socket.Dialer
//	err := l.ConnectToURI(libvirt.QEMUSystem)
//
// Through SSH and the real client (see package sshtest for the server):
//
//	f := libvirtfake.New()
//	env := sshtest.NewEnv(t, f.ServeConn) // forwards the libvirt socket to f
//	// dial env.Addr as env.User with env.KeyFile, checking env.KnownHostsFile,
//	// then client.Dial("unix", env.Socket) is the libvirt connection.
//
// Arrange the host with the setters (AddPool, SetPoolActive, PutVolume,
// SetDomainState, SetInterfaceAddresses, ...), break it with the hooks, and
// assert on the snapshots (Pool, Volume, Uploads, Domain, Domains, Calls).
//
// # Hooks
//
//   - FailNext(method, err) fails the next call, Fail(method, err) every call,
//     before the call has any effect. Use real libvirt errors: Errorf builds
//     one with libvirt's wording for the code.
//   - Block(method) holds calls before they take effect, BlockReturn(method)
//     after; both return a Gate to wait on (Entered) and Release.
//     BlockNext(method) holds only the next call, so two concurrent callers
//     can be stopped at the same step and let go in a chosen order.
//   - SetStateAfterCreate(name, state) makes the next start of a domain end
//     shut off, crashed or paused instead of running.
//   - Calls, CallCounts and TotalCalls count calls per method, failed ones
//     included; over the wire AuthList, ConnectOpen and ConnectClose count
//     too, so compare per-method counts to count a provider operation's RPCs.
//   - Over the wire: KillConnections closes every served connection at once,
//     DropNext(method) closes the connection a call arrives on instead of
//     answering it, and Connections counts the connections being served.
//     Hook names include "AuthList", "ConnectOpen" and "ConnectClose", so a
//     libvirt that refuses the user is FailNext("ConnectOpen",
//     Errorf(libvirt.ErrAccessDenied, ...)).
//
// # What is modelled
//
// Errors are libvirt.Error values with libvirt's codes and message texts,
// and travel over ServeConn encoded as libvirtd encodes them.
//
//   - Domains are looked up by UUID, as libvirt's drivers do: a handle from
//     before an undefine and redefine fails with ErrNoDomain. A definition
//     without <uuid> gets a fresh one, so redefining an existing name without
//     its uuid fails with ErrOperationFailed. A new domain is shut off.
//   - States and reasons: DomainCreate runs a domain (ErrOperationInvalid
//     when already active); DomainDestroyFlags stops it (ErrOperationInvalid
//     when inactive); DomainReset resets an active domain in place, keeping
//     its id and addresses (a crashed one runs again, a paused one stays
//     paused; ErrOperationInvalid when inactive); DomainInfo counts starts
//     and resets; paused, pmsuspended and crashed domains count as
//     active. Undefining an active domain leaves it running as a transient
//     domain that disappears when it stops.
//   - UEFI (<os firmware="efi">, a pflash loader or an <nvram> element): the
//     NVRAM file is created on the first start, and from then on undefine
//     without DomainUndefineNvram or DomainUndefineKeepNvram fails with
//     ErrOperationInvalid "cannot undefine domain with nvram".
//   - <metadata>: children without a namespace are dropped and only the
//     first element per namespace is kept. DomainGetMetadata with
//     DomainMetadataElement returns the element without its namespace
//     declaration or prefix, as libvirtd 9.0 does, serialised as libxml2's
//     xmlNodeDump does: self-closing empty elements, double-quoted
//     attributes, and a compact element re-indented by two spaces per level,
//     while one written with its own whitespace keeps it. No element for the
//     URI is ErrNoDomainMetadata; a nil URI is ErrInvalidArg.
//   - Interface addresses per source: the agent fails with
//     ErrAgentUnresponsive and the lease and ARP sources answer empty until
//     SetInterfaceAddresses says otherwise; an inactive domain is
//     ErrOperationInvalid. AssignAddresses(source, prefix) makes each
//     domain's first start give it the next address of a range on one
//     source, as a guest taking a DHCP lease does.
//   - Pools: lookups by UUID; volume calls on a stopped pool fail with
//     ErrOperationInvalid "storage pool 'x' is not active";
//     StoragePoolGetInfo reports capacity, the sum of the volumes'
//     allocations and what is left.
//   - Volumes: the key and path are <pool path>/<name>; capacity and
//     allocation units as libvirt scales them; raw volumes without
//     <allocation> are fully allocated, other formats start thin; a backing
//     store must be the path of an existing volume; creating an existing name
//     is ErrStorageVolExist; a volume with a transfer running cannot be
//     deleted. StoragePoolRefresh probes content like a dir pool: qcow2
//     magic makes a volume qcow2 with the header's virtual size.
//   - Uploads write at the offset, keep the bytes, grow the allocation and
//     fail like libvirtd's file stream when the data goes past the declared
//     length or the pool runs out of space. A short stream is accepted. A
//     body whose Read fails aborts the stream; libvirtd confirms an abort
//     like a finish, so the upload returns the body's own error (directly,
//     and from go-libvirt over the wire) and is recorded with ErrRPC
//     "stream aborted at client request". Each upload is recorded with the
//     bytes that actually arrived (Uploads). Downloads read the written bytes, zeros beyond them in a
//     raw file.
//
// # What is not
//
// Networks, snapshots, events, XML validation beyond the fields above,
// DomainGetXMLDesc (libvirt would reformat the definition), firmware lookup
// (a missing OVMF is an error to inject), the LIVE/CONFIG split of
// definitions, namespaces inherited from ancestors in metadata output,
// entity and non-ASCII escaping, and the qcow2 file format itself beyond its
// header's virtual size. Pool sizes do not change on their own.
package libvirtfake
