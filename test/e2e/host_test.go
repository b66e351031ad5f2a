//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// nvramDir is where libvirt keeps each UEFI domain's NVRAM copy.
const nvramDir = "/var/lib/libvirt/qemu/nvram"

// libvirtHost runs virsh on the local libvirt host over SSH, as the test user, the way an
// operator of a real hypervisor would look at it.
type libvirtHost struct {
	env hostEnv
	c   *ssh.Client
}

func dialHost(t *testing.T, h hostEnv) *libvirtHost {
	t.Helper()
	key, err := os.ReadFile(h.Key)
	if err != nil {
		t.Fatalf("reading the test user's key: %v", err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatalf("parsing %s: %v", h.Key, err)
	}
	hk, err := knownhosts.New(h.KnownHosts)
	if err != nil {
		t.Fatalf("reading %s: %v", h.KnownHosts, err)
	}
	c, err := ssh.Dial("tcp", h.Address, &ssh.ClientConfig{
		User: h.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hk, Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("ssh %s@%s: %v", h.User, h.Address, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &libvirtHost{env: h, c: c}
}

// run runs a shell command on the host and returns its stdout.
func (lh *libvirtHost) run(cmd string) (string, error) {
	s, err := lh.c.NewSession()
	if err != nil {
		return "", fmt.Errorf("ssh session to %s: %w", lh.env.Address, err)
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	s.Stdout, s.Stderr = &out, &errOut
	if err := s.Run(cmd); err != nil {
		return out.String(), fmt.Errorf("%s on %s: %w (%s)", cmd, lh.env.Address, err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

func (lh *libvirtHost) virsh(args string) (string, error) {
	return lh.run("virsh -q -c qemu:///system " + args)
}

// domains lists every domain's name, running or not.
func (lh *libvirtHost) domains() ([]string, error) {
	out, err := lh.virsh("list --all --name")
	return strings.Fields(out), err
}

func (lh *libvirtHost) volumes() ([]string, error) {
	out, err := lh.virsh("vol-list --pool " + lh.env.Pool)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, err
}

// leftovers lists what remains of instance vm: its domain, its volumes, files in the pool
// directory and its NVRAM copy. The NVRAM directory is read locally: only root and QEMU's
// user may enter libvirt's state directory.
func (lh *libvirtHost) leftovers(vm string) []string {
	var left []string
	doms, err := lh.domains()
	if err != nil {
		left = append(left, "listing domains: "+err.Error())
	}
	for _, d := range doms {
		if d == vm {
			left = append(left, "domain "+d)
		}
	}
	vols, err := lh.volumes()
	if err != nil {
		left = append(left, "listing volumes: "+err.Error())
	}
	for _, v := range vols {
		if strings.HasPrefix(v, vm) {
			left = append(left, "volume "+v)
		}
	}
	files, err := lh.run("ls -1 " + lh.env.PoolPath)
	if err != nil {
		left = append(left, "listing the pool directory: "+err.Error())
	}
	for _, f := range strings.Fields(files) {
		if strings.HasPrefix(f, vm) {
			left = append(left, "file "+filepath.Join(lh.env.PoolPath, f))
		}
	}
	nv, _ := filepath.Glob(filepath.Join(nvramDir, vm+"*"))
	for _, f := range nv {
		left = append(left, "nvram "+f)
	}
	return left
}

// removeInstance deletes domain vm and its volumes, whatever state they are in.
func (lh *libvirtHost) removeInstance(vm string) {
	_, _ = lh.virsh("destroy " + vm)
	_, _ = lh.virsh("undefine --nvram --managed-save " + vm)
	for _, v := range []string{vm + ".qcow2", vm + "-seed.iso"} {
		_, _ = lh.virsh(fmt.Sprintf("vol-delete --pool %s %s", lh.env.Pool, v))
	}
}

// removeBaseImage deletes the cached copy of catalogue image key, so the next Create
// downloads it again.
func (lh *libvirtHost) removeBaseImage(key string) {
	for _, v := range []string{"base-" + key + ".qcow2", "base-" + key + ".qcow2.sha256"} {
		_, _ = lh.virsh(fmt.Sprintf("vol-delete --pool %s %s", lh.env.Pool, v))
	}
}

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

func watchBoots(lh *libvirtHost, vm string) *bootWatch {
	bw := &bootWatch{seen: map[string]*domainSeen{}, stop: make(chan struct{}), done: make(chan struct{})}
	prefix := lh.env.BridgeIP[:strings.LastIndex(lh.env.BridgeIP, ".")+1]
	go func() {
		defer close(bw.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			out, _ := lh.run(fmt.Sprintf("virsh -q -c qemu:///system domuuid %[1]s && virsh -q -c qemu:///system domstate %[1]s && "+
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

// diskWrites is the number of write requests domain vm has made to its disk vda.
func (lh *libvirtHost) diskWrites(vm string) (int, error) {
	out, err := lh.virsh("domstats --block " + vm)
	if err != nil {
		return 0, err
	}
	idx := ""
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		if strings.HasSuffix(k, ".name") && v == "vda" {
			idx = strings.TrimSuffix(k, ".name")
		}
		if idx != "" && k == idx+".wr.reqs" {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no write count of vda in the block stats of %s: %q", vm, out)
}
