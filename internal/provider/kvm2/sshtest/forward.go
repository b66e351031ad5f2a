package sshtest

import (
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// streamLocalOpen is the payload of a direct-streamlocal@openssh.com open
// (OpenSSH's PROTOCOL, section 2.4).
type streamLocalOpen struct {
	SocketPath string
	Reserved0  string
	Reserved1  uint32
}

func (s *Server) openChannel(c *connState, nc ssh.NewChannel, wg *sync.WaitGroup) {
	reject := func(reason ssh.RejectionReason, msg string) {
		s.mu.Lock()
		s.stats.RefusedOpens++
		s.mu.Unlock()
		_ = nc.Reject(reason, msg)
	}
	if nc.ChannelType() != "direct-streamlocal@openssh.com" {
		reject(ssh.UnknownChannelType, "unknown channel type")
		return
	}
	var msg streamLocalOpen
	if err := ssh.Unmarshal(nc.ExtraData(), &msg); err != nil {
		reject(ssh.ConnectionFailed, "malformed direct-streamlocal request")
		return
	}
	s.mu.Lock()
	h, refuse := s.handlers[msg.SocketPath], s.refuse
	s.mu.Unlock()
	switch {
	case refuse:
		reject(ssh.Prohibited, "administratively prohibited")
		return
	case h == nil:
		reject(ssh.ConnectionFailed, "open failed: connect to "+msg.SocketPath+": No such file or directory")
		return
	}
	// Counted before the confirmation goes out, so a client holding the
	// channel always finds it in the stats.
	s.mu.Lock()
	s.stats.Channels++
	s.stats.OpenChannels++
	c.info.Channels++
	c.info.OpenChannels++
	s.mu.Unlock()
	closed := func() {
		s.mu.Lock()
		s.stats.OpenChannels--
		c.info.OpenChannels--
		s.mu.Unlock()
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		closed()
		return
	}
	go ssh.DiscardRequests(reqs)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer closed()
		conn := &channelConn{Channel: ch, local: unixAddr(msg.SocketPath), remote: c.tcp.RemoteAddr()}
		defer conn.Close()
		h(conn)
	}()
}

// channelConn presents a forwarded channel as a net.Conn.
type channelConn struct {
	ssh.Channel
	local, remote net.Addr
	closeOnce     sync.Once
}

func (c *channelConn) Close() error {
	var err error
	c.closeOnce.Do(func() { err = c.Channel.Close() })
	return err
}
func (c *channelConn) LocalAddr() net.Addr  { return c.local }
func (c *channelConn) RemoteAddr() net.Addr { return c.remote }

var errNoDeadlines = errors.New("sshtest: deadlines are not supported on forwarded channels")

func (c *channelConn) SetDeadline(time.Time) error      { return errNoDeadlines }
func (c *channelConn) SetReadDeadline(time.Time) error  { return errNoDeadlines }
func (c *channelConn) SetWriteDeadline(time.Time) error { return errNoDeadlines }

func unixAddr(path string) net.Addr { return &net.UnixAddr{Name: path, Net: "unix"} }
