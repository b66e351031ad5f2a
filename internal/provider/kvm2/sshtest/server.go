package sshtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/crypto/ssh"
)

// DefaultUser is the user a Server accepts unless told otherwise.
const DefaultUser = "novakj"

// Handler serves one forwarded unix-socket connection. The connection is
// closed when the handler returns.
type Handler func(net.Conn)

// Server is an in-process SSH server on 127.0.0.1 that authenticates one
// user by public key and forwards direct-streamlocal@openssh.com channels to
// Handlers. Everything about it can be changed while it runs; changes apply
// to connections accepted afterwards (keys) or at once (the switches).
type Server struct {
	ln   net.Listener
	user string
	wg   sync.WaitGroup

	mu         sync.Mutex
	hostKey    ssh.Signer
	authorized map[string]bool // ssh.PublicKey.Marshal() of each allowed key
	handlers   map[string]Handler
	refuse     bool
	noKeepal   bool
	stall      bool
	closed     bool
	thaw       chan struct{} // non-nil while frozen, see Freeze
	nextID     int
	conns      map[int]*connState
	stats      Stats
}

// Stats counts what the server has seen. The "Open" fields are current
// values, the others totals since the server started.
type Stats struct {
	TCPConns       int // TCP connections accepted, stalled ones included
	SSHConns       int // SSH handshakes that succeeded
	OpenSSHConns   int
	AuthFailures   int // handshakes that failed, for any reason
	Channels       int // forwarded channels accepted
	OpenChannels   int
	RefusedOpens   int // channel opens rejected (refused, unknown socket, other types)
	Keepalives     int // keepalive@openssh.com requests received
	KilledSSHConns int // connections closed by KillConnections or KillConn
}

// ConnInfo describes one accepted SSH connection.
type ConnInfo struct {
	ID           int // 1 for the first SSH connection, then counting up
	User         string
	Open         bool
	Channels     int // forwarded channels accepted on it in total
	OpenChannels int
}

type connState struct {
	info ConnInfo
	tcp  net.Conn
}

// NewServer starts a server on 127.0.0.1:0 with a fresh ed25519 host key
// that accepts user (DefaultUser when empty) with none of its keys
// authorized yet.
func NewServer(user string) (*Server, error) {
	if user == "" {
		user = DefaultUser
	}
	host, err := newEd25519Signer()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on 127.0.0.1: %w", err)
	}
	s := &Server{ln: ln, user: user, hostKey: host, authorized: map[string]bool{},
		handlers: map[string]Handler{}, conns: map[int]*connState{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func newEd25519Signer() (ssh.Signer, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating ed25519 key: %w", err)
	}
	return ssh.NewSignerFromKey(key)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// User is the only user the server accepts.
func (s *Server) User() string { return s.user }

// Close stops accepting, kills every connection and waits for the server's
// goroutines, handlers included, to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.ln.Close()
	s.KillConnections()
	s.wg.Wait()
	return err
}

// Authorize adds a public key to the authorized set.
func (s *Server) Authorize(key ssh.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authorized[string(key.Marshal())] = true
}

// Revoke removes a public key from the authorized set.
func (s *Server) Revoke(key ssh.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.authorized, string(key.Marshal()))
}

// HostKey is the public half of the current host key.
func (s *Server) HostKey() ssh.PublicKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostKey.PublicKey()
}

// RotateHostKey replaces the host key with a fresh one, as a reinstalled
// host would; connections made afterwards present the new key.
func (s *Server) RotateHostKey() (ssh.PublicKey, error) {
	k, err := newEd25519Signer()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hostKey = k
	return k.PublicKey(), nil
}

// Handle routes direct-streamlocal channels for socketPath to h; a nil h
// removes the route, so such opens are rejected as an absent socket is.
func (s *Server) Handle(socketPath string, h Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h == nil {
		delete(s.handlers, socketPath)
		return
	}
	s.handlers[socketPath] = h
}

// RefuseForwarding makes the server reject every direct-streamlocal open as
// administratively prohibited, as sshd without AllowStreamLocalForwarding
// does.
func (s *Server) RefuseForwarding(refuse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = refuse
}

// AnswerKeepalives switches replies to keepalive@openssh.com requests; off,
// requests are swallowed without a reply, as by a hung peer. On by default.
func (s *Server) AnswerKeepalives(answer bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noKeepal = !answer
}

// StallHandshakes makes the server accept new TCP connections and never
// answer them: the client's handshake waits until it gives up or the
// connection is killed.
func (s *Server) StallHandshakes(stall bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall = stall
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Conns describes every SSH connection accepted so far, in order.
func (s *Server) Conns() []ConnInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ConnInfo, 0, len(s.conns))
	for id := 1; id <= s.nextID; id++ {
		if c, ok := s.conns[id]; ok {
			out = append(out, c.info)
		}
	}
	return out
}

// KillConnections closes every TCP connection the server holds, stalled
// ones included, without any SSH goodbye, as a dropped link or a killed
// sshd would.
func (s *Server) KillConnections() {
	s.mu.Lock()
	var tcps []net.Conn
	for _, c := range s.conns {
		if c.info.Open {
			s.stats.KilledSSHConns++
		}
		tcps = append(tcps, c.tcp)
	}
	s.mu.Unlock()
	for _, c := range tcps {
		_ = c.Close()
	}
}

// KillConn closes the TCP connection of one SSH connection (see Conns); it
// reports whether the connection was open.
func (s *Server) KillConn(id int) bool {
	s.mu.Lock()
	c, ok := s.conns[id]
	open := ok && c.info.Open
	if open {
		s.stats.KilledSSHConns++
	}
	s.mu.Unlock()
	if ok {
		_ = c.tcp.Close()
	}
	return open
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			return
		}
		tcp := newFreezableConn(raw, s)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = tcp.Close()
			return
		}
		s.stats.TCPConns++
		s.nextID++
		id := s.nextID
		s.conns[id] = &connState{tcp: tcp}
		stall := s.stall
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.forget(id)
			if stall {
				_, _ = io.Copy(io.Discard, tcp) // read and never answer, until killed
				return
			}
			s.serve(id, tcp)
		}()
	}
}

// forget drops a connection that never completed a handshake; one that did
// stays listed as closed.
func (s *Server) forget(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conns[id]; c != nil && c.info.ID == 0 {
		delete(s.conns, id)
	}
}

func (s *Server) config() *ssh.ServerConfig {
	s.mu.Lock()
	host := s.hostKey
	s.mu.Unlock()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if meta.User() == s.user && s.authorized[string(key.Marshal())] {
				return &ssh.Permissions{}, nil
			}
			return nil, errors.New("public key not authorized")
		},
	}
	cfg.AddHostKey(host)
	return cfg
}

func (s *Server) serve(id int, tcp net.Conn) {
	defer tcp.Close()
	sc, chans, reqs, err := ssh.NewServerConn(tcp, s.config())
	if err != nil {
		s.mu.Lock()
		s.stats.AuthFailures++
		s.mu.Unlock()
		return
	}
	defer sc.Close()
	s.mu.Lock()
	s.stats.SSHConns++
	s.stats.OpenSSHConns++
	c := s.conns[id]
	c.info = ConnInfo{ID: id, User: sc.User(), Open: true}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		c.info.Open = false
		s.stats.OpenSSHConns--
		s.mu.Unlock()
	}()

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.globalRequests(reqs)
	}()
	for nc := range chans {
		s.openChannel(c, nc, &wg)
	}
}

func (s *Server) globalRequests(reqs <-chan *ssh.Request) {
	for req := range reqs {
		if req.Type != "keepalive@openssh.com" {
			_ = req.Reply(false, nil)
			continue
		}
		s.mu.Lock()
		s.stats.Keepalives++
		silent := s.noKeepal
		s.mu.Unlock()
		if !silent {
			// OpenSSH answers this request, which it does not implement,
			// with a failure; the reply is what the client waits for.
			_ = req.Reply(false, nil)
		}
	}
}
