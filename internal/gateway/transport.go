package gateway

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"time"
)

type exitKey struct{}

func withExit(ctx context.Context, e Exit) context.Context {
	return context.WithValue(ctx, exitKey{}, e)
}

// newTransport is the client side of plain-HTTP forwarding: requests go to the exit in
// their context as absolute-URI requests, with the exit's own credentials in
// Proxy-Authorization; connections to each exit are kept alive and reused.
func (g *Gateway) newTransport() *http.Transport {
	d := &net.Dialer{Timeout: g.cfg.ExitTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) {
			e, _ := r.Context().Value(exitKey{}).(Exit)
			u := &url.URL{Scheme: "http", Host: e.Address}
			if e.User != "" || e.Password != "" {
				u.User = url.UserPassword(e.User, e.Password)
			}
			return u, nil
		},
		DialContext:           d.DialContext,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: g.cfg.ResponseHeaderTimeout,
		// The client's Accept-Encoding goes through as it is; the gateway never decodes.
		DisableCompression: true,
		TLSNextProto:       map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}
