//go:build !linux

package gateway

import (
	"io"
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// pump copies src to dst until src's end (nil) or an error, counting the bytes.
func pump(dst, src *net.TCPConn, count prometheus.Counter) error {
	n, err := io.Copy(dst, src)
	count.Add(float64(n))
	return err
}
