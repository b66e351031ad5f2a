//go:build !linux

package gateway

import (
	"errors"
	"net"
	"syscall"
)

// alive cannot look without reading elsewhere; a closed connection is found by the
// request sent on it, which is then sent again on a new one when it has no body.
func alive(net.Conn) bool { return true }

func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
