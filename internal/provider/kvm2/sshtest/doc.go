// Package sshtest runs an in-process SSH server for the kvm2 provider's
// tests: the hypervisor's sshd, reduced to what the provider uses.
//
// The server listens on 127.0.0.1:0, accepts one user by public key against
// an authorized set, presents its own ed25519 host key, and forwards
// direct-streamlocal@openssh.com channels (ssh.Client.Dial("unix", path)) to
// a Handler registered for the socket path, typically a libvirtfake.Fake's
// ServeConn. It answers keepalive@openssh.com global requests the way
// OpenSSH does (a failure reply, which is still a reply).
//
// # A test environment
//
//	fake := libvirtfake.New()
//	env := sshtest.NewEnv(t, fake.ServeConn)
//	// env.Addr, env.User, env.KeyFile (ed25519, OpenSSH format),
//	// env.KnownHostsFile (the server's key under env.Addr) and env.Socket
//	// (DefaultSocket, the path the provider's config defaults to) are what
//	// a kvm2 host entry and its credential files need.
//
// Env.AddHost starts a further server for the same key and known_hosts
// files, for configurations with several hosts. NewEnv tears everything
// down with t.Cleanup. Env.Dial and
// Env.ClientConfig connect the way the provider does, for tests of the
// fixtures themselves.
//
// # Breaking things
//
//   - Credentials: RotateClientKey (new key file, old key revoked),
//     Authorize / Revoke, WriteKey with the OpenSSH or PEM format; host key:
//     RotateHostKey (known_hosts now mismatches) and RewriteKnownHosts.
//   - RefuseForwarding rejects every forwarded socket as administratively
//     prohibited; a path with no Handler is rejected as an absent socket.
//   - AnswerKeepalives(false) swallows keepalive requests unanswered.
//   - StallHandshakes accepts TCP connections and never speaks SSH on them.
//   - KillConnections closes every TCP connection (KillConn one of them)
//     with no SSH goodbye.
//   - Freeze stops all traffic without closing anything, as a host that
//     dropped off the network: keepalives go unanswered and a client's
//     writes block once the buffers are full, until Freeze(false) or a kill.
//
// # Observing
//
// Stats counts TCP connections, successful and failed handshakes, forwarded
// channels (total and open), refused opens, keepalives and kills. Conns
// lists each SSH connection with its own channel counts, so a test can tell
// that a health check dialled a connection of its own and never opened a
// channel on the pooled one. A channel is counted before the client gets it,
// but a handshake is counted when the server side of it returns, which can
// be a moment after the client's Dial does: wait for connection counts
// rather than reading them once.
//
// Deadlines are not supported on the net.Conn a Handler receives.
package sshtest
