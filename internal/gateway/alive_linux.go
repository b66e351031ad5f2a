package gateway

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// alive tells whether a kept-alive connection nobody has read since it went idle is
// still open: a non-blocking peek finds nothing to read (open), or the peer's close or
// reset, or bytes nobody asked for (not usable either).
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var one [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = errors.Is(err, unix.EAGAIN)
		return true // never wait: the answer is now
	})
	return err == nil && open
}

// isConnReset: the peer reset the connection, or it broke while writing to it.
func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
