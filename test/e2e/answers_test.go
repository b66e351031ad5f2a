//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// answerWatch sends a request through a guest's proxy every 250 ms until one succeeds and
// records when: the moment the guest's proxy began to serve, which splits Running → Ready
// into the guest's share (its proxy starting) and the operator's (the probe).
type answerWatch struct {
	mu       sync.Mutex
	answered time.Time
	stop     chan struct{}
	done     chan struct{}
}

// watchAnswers starts sending GET target through http://ip:port with the proxy's
// credentials user (nil: none). target must not be the health probe's own, whose callers
// the test counts.
func watchAnswers(ip string, port int32, user *url.Userinfo, target string) *answerWatch {
	aw := &answerWatch{stop: make(chan struct{}), done: make(chan struct{})}
	proxy := &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", ip, port), User: user}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}
	go func() {
		defer close(aw.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := framework.Get(c, target); err == nil {
				aw.mu.Lock()
				aw.answered = time.Now()
				aw.mu.Unlock()
				return
			}
			select {
			case <-aw.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return aw
}

// close stops the watch and returns when the proxy first answered (zero if never).
func (aw *answerWatch) close() time.Time {
	close(aw.stop)
	<-aw.done
	aw.mu.Lock()
	defer aw.mu.Unlock()
	return aw.answered
}
