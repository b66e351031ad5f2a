package sshtest

import (
	"net"
	"sync"
)

// Freeze stops (true) or resumes (false) all traffic on every connection,
// new ones included: the server neither reads nor writes, as a host that
// vanished from the network without closing anything. A client writing to
// a frozen server blocks once the TCP buffers are full, which is what a
// stuck transfer looks like; KillConnections still closes frozen
// connections, and so does the client closing its end.
func (s *Server) Freeze(frozen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case frozen && s.thaw == nil:
		s.thaw = make(chan struct{})
	case !frozen && s.thaw != nil:
		close(s.thaw)
		s.thaw = nil
	}
}

// thawed returns nil when traffic may flow, or a channel closed when it
// may flow again.
func (s *Server) thawed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.thaw
}

// freezableConn is an accepted TCP connection that waits, before every read
// and write, while the server is frozen.
type freezableConn struct {
	net.Conn
	s         *Server
	closed    chan struct{}
	closeOnce sync.Once
}

func newFreezableConn(c net.Conn, s *Server) *freezableConn {
	return &freezableConn{Conn: c, s: s, closed: make(chan struct{})}
}

func (c *freezableConn) wait() error {
	if ch := c.s.thawed(); ch != nil {
		select {
		case <-ch:
		case <-c.closed:
			return net.ErrClosed
		}
	}
	return nil
}

func (c *freezableConn) Read(b []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *freezableConn) Write(b []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *freezableConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
