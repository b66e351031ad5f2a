package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The direction label of the bytes metric: upstream is from the client towards the
// site, downstream from the site towards the client.
const (
	directionUp   = "upstream"
	directionDown = "downstream"
)

// What a count is of: a plain-HTTP request or a tunnel (CONNECT or SOCKS5).
const (
	kindRequest = "request"
	kindTunnel  = "tunnel"
)

type metrics struct {
	requests *prometheus.CounterVec
	tunnels  *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	open     prometheus.Gauge
	choice   prometheus.Histogram
	// Holding and demand per pool.
	held         *prometheus.GaugeVec
	wait         *prometheus.HistogramVec
	poolSessions *prometheus.GaugeVec
	poolRPS      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, g *Gateway) (*metrics, error) {
	labels := []string{"namespace", "pool", "outcome"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxy_operator_gateway_requests_total",
			Help: "Plain-HTTP requests the gateway answered, by the exit's namespace (the requested one when no exit was chosen), the requested pool and outcome (ok, retried, saturated, no_exit, exit_failed, client_gone, auth_failed, bad_request; the last two without namespace and pool).",
		}, labels),
		tunnels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxy_operator_gateway_tunnels_total",
			Help: "CONNECT and SOCKS5 tunnels the gateway answered, by the exit's namespace (the requested one when no exit was chosen), the requested pool and outcome (ok, retried, saturated, no_exit, exit_failed, client_gone, auth_failed, bad_request; the last two without namespace and pool).",
		}, labels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxy_operator_gateway_bytes_total",
			Help: "Bytes carried, by the exit's namespace, the requested pool and direction (upstream: client to site; downstream: site to client). Plain HTTP counts bodies; tunnels count every byte.",
		}, []string{"namespace", "pool", "direction"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxy_operator_gateway_tunnels_open",
			Help: "Tunnels open now.",
		}),
		choice: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxy_operator_gateway_choice_seconds",
			Help:    "Time the Chooser took to choose an exit.",
			Buckets: []float64{1e-6, 5e-6, 2e-5, 1e-4, 5e-4, 2e-3, 1e-2, 5e-2, 0.25, 1},
		}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxy_operator_gateway_held_requests",
			Help: "Requests and tunnels held now waiting for an exit of a pool that has none eligible yet, by the pool's namespace and name.",
		}, []string{"namespace", "pool"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxy_operator_gateway_activation_wait_seconds",
			Help:    "How long held requests waited for an exit of their pool, by the pool's namespace and name and how the wait ended (served, timeout, client_gone, full, shutdown, refused).",
			Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300},
		}, []string{"namespace", "pool", "outcome"}),
		poolSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxy_operator_gateway_pool_sessions",
			Help: "This replica's concurrent sessions per pool, as last measured: open tunnels plus live sessions (held requests are in proxy_operator_gateway_held_requests).",
		}, []string{"namespace", "pool"}),
		poolRPS: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxy_operator_gateway_pool_requests_per_second",
			Help: "This replica's requests and tunnels per second per pool, over the last measuring interval.",
		}, []string{"namespace", "pool"}),
	}
	live := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "proxy_operator_gateway_sessions_live",
		Help: "Sessions this replica carried within their sesstime (sliding idle lifetime).",
	}, func() float64 { return float64(g.sessions.live()) })
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.tunnels, m.bytes, m.open, m.choice, live, m.held, m.wait, m.poolSessions, m.poolRPS} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// count adds one request or tunnel with its outcome. A refused caller's namespace and
// pool are whatever it wrote: they are counted without them, so that no caller can make
// series up.
func (g *Gateway) count(kind, namespace, pool, outcome string) {
	if outcome == outcomeAuthFailed || outcome == outcomeBadRequest {
		namespace, pool = "", ""
	}
	v := g.metrics.requests
	if kind == kindTunnel {
		v = g.metrics.tunnels
	}
	v.WithLabelValues(namespace, pool, outcome).Inc()
}
