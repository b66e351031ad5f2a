package gateway

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// exitTransport is the client side of plain-HTTP forwarding: a request goes to its exit
// as an absolute-URI request with the exit's own credentials in Proxy-Authorization, on
// a connection to that exit kept alive for the next request.
//
// It is not net/http's Transport on purpose. That one hands every request to a writing
// goroutine and every response back from a reading one; on a small request each handoff
// is a goroutine wake-up, and together they were most of the gateway's added latency.
// Here the client's own handler goroutine writes the request and reads the response on
// the exit connection, and a connection waits in the pool with nobody reading it. So a
// pooled connection the exit has closed in the meantime is found when it is taken out
// (alive, a cheap non-blocking peek on Linux) and, when a request finds it closed before
// any byte of the answer, the request is sent again once on a new connection if it has
// no body.
type exitTransport struct {
	dialer            net.Dialer
	headerTimeout     time.Duration
	idleTimeout       time.Duration
	maxIdlePerExit    int
	mu                sync.Mutex
	idle              map[exitConnKey][]*exitConn
	closed            bool
	stopReap, reaping chan struct{}
}

// exitConnKey: connections are shared by requests to the same exit with the same
// credentials.
type exitConnKey struct{ addr, user, password string }

type exitConn struct {
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	idleFrom time.Time
	reused   bool
}

func (g *Gateway) newTransport() *exitTransport {
	t := &exitTransport{
		dialer:         net.Dialer{Timeout: g.cfg.ExitTimeout, KeepAlive: 30 * time.Second},
		headerTimeout:  g.cfg.ResponseHeaderTimeout,
		idleTimeout:    90 * time.Second,
		maxIdlePerExit: 256,
		idle:           map[exitConnKey][]*exitConn{},
		stopReap:       make(chan struct{}),
		reaping:        make(chan struct{}),
	}
	go t.reap()
	return t
}

// errStaleConn: a pooled connection was found closed before the request got any answer.
var errStaleConn = errors.New("a kept-alive connection to the exit was closed by it")

// RoundTrip sends req through exit and returns the exit's response. The response's
// Body must be read to its end or closed; either gives the connection back (kept for the
// next request when the response allows).
func (t *exitTransport) RoundTrip(req *http.Request, exit Exit) (*http.Response, error) {
	key := exitConnKey{exit.Address, exit.User, exit.Password}
	if exit.User != "" || exit.Password != "" {
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(exit.User+":"+exit.Password)))
	} else {
		req.Header.Del("Proxy-Authorization")
	}
	replayable := req.Body == nil || req.Body == http.NoBody
	for {
		pc, err := t.get(key)
		if err != nil {
			return nil, err
		}
		resp, err := t.send(pc, req)
		if err == nil {
			resp.Body = &exitBody{ReadCloser: resp.Body, t: t, key: key, pc: pc, keep: !resp.Close,
				eof: resp.Body == http.NoBody}
			return resp, nil
		}
		pc.c.Close()
		if errors.Is(err, errStaleConn) && replayable {
			continue // the next get dials when no other pooled connection is alive
		}
		return nil, err
	}
}

// send writes req on pc and reads the response's header.
func (t *exitTransport) send(pc *exitConn, req *http.Request) (*http.Response, error) {
	if err := req.WriteProxy(pc.bw); err != nil {
		return nil, t.stale(pc, fmt.Errorf("sending the request to the exit: %w", err))
	}
	if err := pc.bw.Flush(); err != nil {
		return nil, t.stale(pc, fmt.Errorf("sending the request to the exit: %w", err))
	}
	pc.c.SetReadDeadline(time.Now().Add(t.headerTimeout))
	if _, err := pc.br.Peek(1); err != nil {
		if isTimeout(err) {
			return nil, fmt.Errorf("the exit sent no response header within %s", t.headerTimeout)
		}
		return nil, t.stale(pc, fmt.Errorf("reading the exit's response: %w", err))
	}
	for {
		resp, err := http.ReadResponse(pc.br, req)
		if err != nil {
			if isTimeout(err) {
				return nil, fmt.Errorf("the exit sent no complete response header within %s", t.headerTimeout)
			}
			return nil, fmt.Errorf("reading the exit's response: %w", err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue // an informational answer: the final one follows
		}
		pc.c.SetReadDeadline(time.Time{})
		return resp, nil
	}
}

// stale marks err as a closed kept-alive connection when pc was reused and the exit
// closed it: nothing of a response came, so the exit did not act on the request.
func (t *exitTransport) stale(pc *exitConn, err error) error {
	if pc.reused && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)) {
		return fmt.Errorf("%w: %w", errStaleConn, err)
	}
	return err
}

// get takes an idle connection to key's exit that is still open, or dials one.
func (t *exitTransport) get(key exitConnKey) (*exitConn, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		list := t.idle[key]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		if len(list) == 1 {
			delete(t.idle, key)
		} else {
			t.idle[key] = list[:len(list)-1]
		}
		t.mu.Unlock()
		if now.Sub(pc.idleFrom) < t.idleTimeout && alive(pc.c) {
			pc.reused = true
			return pc, nil
		}
		pc.c.Close()
	}
	c, err := t.dialer.Dial("tcp", key.addr)
	if err != nil {
		return nil, err
	}
	return &exitConn{c: c, br: bufio.NewReaderSize(c, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

// put keeps pc for the next request to key's exit, or closes it.
func (t *exitTransport) put(key exitConnKey, pc *exitConn) {
	pc.idleFrom = time.Now()
	t.mu.Lock()
	if t.closed || len(t.idle[key]) >= t.maxIdlePerExit || pc.br.Buffered() > 0 {
		t.mu.Unlock()
		pc.c.Close()
		return
	}
	t.idle[key] = append(t.idle[key], pc)
	t.mu.Unlock()
}

// reap closes connections idle longer than the idle timeout, so that an exit that is gone
// from the pool of exits does not keep its connections open.
func (t *exitTransport) reap() {
	defer close(t.reaping)
	tick := time.NewTicker(t.idleTimeout / 3)
	defer tick.Stop()
	for {
		select {
		case <-t.stopReap:
			return
		case now := <-tick.C:
			var old []*exitConn
			t.mu.Lock()
			for key, list := range t.idle {
				keep := list[:0]
				for _, pc := range list {
					if now.Sub(pc.idleFrom) >= t.idleTimeout {
						old = append(old, pc)
					} else {
						keep = append(keep, pc)
					}
				}
				clear(list[len(keep):])
				if len(keep) == 0 {
					delete(t.idle, key)
				} else {
					t.idle[key] = keep
				}
			}
			t.mu.Unlock()
			for _, pc := range old {
				pc.c.Close()
			}
		}
	}
}

// CloseIdleConnections closes every pooled connection; with final, the transport keeps
// none afterwards and stops its reaper.
func (t *exitTransport) CloseIdleConnections(final bool) {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[exitConnKey][]*exitConn{}
	stop := final && !t.closed
	if final {
		t.closed = true
	}
	t.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.c.Close()
		}
	}
	if stop {
		close(t.stopReap)
		<-t.reaping
	}
}

// exitBody is a response body on a pooled connection: read to its end, the connection
// goes back to the pool; closed before that, the connection is closed.
type exitBody struct {
	io.ReadCloser
	t    *exitTransport
	key  exitConnKey
	pc   *exitConn
	keep bool
	eof  bool
	done bool
}

func (b *exitBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *exitBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if !b.eof || !b.keep {
		// Closed first, so that closing the body does not read the rest of it.
		b.pc.c.Close()
		b.ReadCloser.Close()
		return nil
	}
	err := b.ReadCloser.Close()
	b.t.put(b.key, b.pc)
	return err
}
