//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// domainSeen is what a bootWatch saw of one incarnation (UUID) of a domain.
type domainSeen struct {
	uuid             string
	running, address time.Time
	ip               string
}

// bootWatch polls a domain every 500 ms and records, per UUID, when it was first seen
// running and when its guest agent first reported an address on the bridge: the guest's
// own boot time, independent of the operator.
type bootWatch struct {
	mu   sync.Mutex
	seen map[string]*domainSeen
	stop chan struct{}
	done chan struct{}
}

func watchBoots(lh *framework.Host, vm string) *bootWatch {
	bw := &bootWatch{seen: map[string]*domainSeen{}, stop: make(chan struct{}), done: make(chan struct{})}
	prefix := lh.Env.BridgeIP[:strings.LastIndex(lh.Env.BridgeIP, ".")+1]
	go func() {
		defer close(bw.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			out, _ := lh.Run(fmt.Sprintf("virsh -q -c qemu:///system domuuid %[1]s && virsh -q -c qemu:///system domstate %[1]s && "+
				"virsh -q -c qemu:///system domifaddr --source agent %[1]s 2>/dev/null", vm))
			bw.record(out, prefix, time.Now())
			select {
			case <-bw.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return bw
}

func (bw *bootWatch) record(out, prefix string, now time.Time) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || strings.TrimSpace(lines[0]) == "" {
		return
	}
	uuid, state := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
	bw.mu.Lock()
	defer bw.mu.Unlock()
	d := bw.seen[uuid]
	if d == nil {
		d = &domainSeen{uuid: uuid}
		bw.seen[uuid] = d
	}
	if state == "running" && d.running.IsZero() {
		d.running = now
	}
	for _, l := range lines[2:] {
		f := strings.Fields(l)
		if len(f) == 4 && f[2] == "ipv4" && strings.HasPrefix(f[3], prefix) && d.address.IsZero() {
			d.address, d.ip = now, strings.Split(f[3], "/")[0]
		}
	}
}

func (bw *bootWatch) get(uuid string) domainSeen {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	if d := bw.seen[uuid]; d != nil {
		return *d
	}
	return domainSeen{uuid: uuid}
}

func (bw *bootWatch) close() {
	close(bw.stop)
	<-bw.done
}
