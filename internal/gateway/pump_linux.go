package gateway

import (
	"io"
	"net"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// pump copies src to dst until src's end (nil) or an error, counting the bytes.
//
// The bytes go through TCPConn.ReadFrom, the path io.Copy between two TCP connections
// takes, which splices them in the kernel without copying them into the process. One
// difference: a splice holds a pipe (two descriptors and a kernel buffer) for as long as
// it waits for data, so pump first waits for src to be readable without one and then
// splices exactly the bytes waiting. An idle tunnel holds no pipe and no buffer, only its
// two sockets and two parked goroutines.
func pump(dst, src *net.TCPConn, count prometheus.Counter) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	lr := io.LimitedReader{R: src}
	for {
		avail, err := waitReadable(rc)
		if err != nil {
			return err
		}
		if avail == 0 {
			return nil
		}
		lr.N = int64(avail)
		n, err := dst.ReadFrom(&lr)
		if n > 0 {
			count.Add(float64(n))
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// waitReadable waits until the socket has bytes to read, and returns how many, or 0 at
// its end.
func waitReadable(rc syscall.RawConn) (int, error) {
	var avail int
	var serr error
	err := rc.Read(func(fd uintptr) bool {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			serr = err
			return true
		}
		if n > 0 {
			avail = n
			return true
		}
		var b [1]byte
		m, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			return false
		case err != nil:
			serr = err
		default:
			avail = m // 0: the peer closed its side
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return avail, serr
}
