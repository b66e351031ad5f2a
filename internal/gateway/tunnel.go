package gateway

import (
	"errors"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// tunnel is an open pair of client and exit connections.
type tunnel struct {
	client, exit *net.TCPConn
}

func (t *tunnel) close() {
	t.client.Close()
	t.exit.Close()
}

// startTunnel pumps bytes both ways between client and exitConn on two goroutines of
// their own (the handler's goroutine, whose stack grew reading headers, returns). early
// are bytes the client sent before the tunnel opened, rest bytes the exit sent after its
// answer. Each direction ends by half-closing its destination; an error closes both.
func (g *Gateway) startTunnel(client, exitConn *net.TCPConn, early, rest []byte, rt *route, exit Exit) {
	t := &tunnel{client: client, exit: exitConn}
	g.mu.Lock()
	g.tunnels[t] = struct{}{}
	g.mu.Unlock()
	g.metrics.open.Inc()
	key := rt.demand
	if key.pool != "" {
		g.demand.tunnel(key, 1)
	}
	up := g.metrics.bytes.WithLabelValues(rt.namespace, rt.pool, directionUp)
	down := g.metrics.bytes.WithLabelValues(rt.namespace, rt.pool, directionDown)
	var left atomic.Int32
	left.Store(2)
	finish := func() {
		if left.Add(-1) == 0 {
			t.close()
			g.mu.Lock()
			delete(g.tunnels, t)
			g.mu.Unlock()
			g.metrics.open.Dec()
			if key.pool != "" {
				g.demand.tunnel(key, -1)
			}
			g.wg.Done()
		}
	}
	g.wg.Add(1)
	go func() {
		defer finish()
		g.direction(t, exitConn, client, early, up)
	}()
	go func() {
		defer finish()
		g.direction(t, client, exitConn, rest, down)
	}()
}

// direction copies src to dst after first writing head; at src's end it half-closes dst.
func (g *Gateway) direction(t *tunnel, dst, src *net.TCPConn, head []byte, count prometheus.Counter) {
	if len(head) > 0 {
		if _, err := dst.Write(head); err != nil {
			t.close()
			return
		}
		count.Add(float64(len(head)))
	}
	if err := pump(dst, src, count); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			g.log.V(1).Info("tunnel closed on an error", "error", err.Error())
		}
		t.close()
		return
	}
	dst.CloseWrite()
}
