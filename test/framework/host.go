package framework

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// NVRAMDir is where libvirt keeps each UEFI domain's NVRAM copy.
const NVRAMDir = "/var/lib/libvirt/qemu/nvram"

// Host runs shell commands on the libvirt host: over SSH as the test user, the way an
// operator of a real hypervisor would look at it (DialHost), or on this machine, which is
// the host (LocalHost).
type Host struct {
	Env HostEnv
	run func(cmd string) (string, error)
}

// DialHost connects to the host over SSH with the test user's key; the connection closes
// when the test ends.
func DialHost(t testing.TB, h HostEnv) *Host {
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
	return &Host{Env: h, run: func(cmd string) (string, error) {
		s, err := c.NewSession()
		if err != nil {
			return "", fmt.Errorf("ssh session to %s: %w", h.Address, err)
		}
		defer s.Close()
		var out, errOut bytes.Buffer
		s.Stdout, s.Stderr = &out, &errOut
		if err := s.Run(cmd); err != nil {
			return out.String(), fmt.Errorf("%s on %s: %w (%s)", cmd, h.Address, err, strings.TrimSpace(errOut.String()))
		}
		return out.String(), nil
	}}
}

// LocalHost runs the commands on this machine, with the test's own rights.
func LocalHost(h HostEnv) *Host {
	return &Host{Env: h, run: func(cmd string) (string, error) {
		var out, errOut bytes.Buffer
		c := exec.Command("sh", "-c", cmd)
		c.Stdout, c.Stderr = &out, &errOut
		if err := c.Run(); err != nil {
			return out.String(), fmt.Errorf("%s: %w (%s)", cmd, err, strings.TrimSpace(errOut.String()))
		}
		return out.String(), nil
	}}
}

// Run runs a shell command on the host and returns its stdout.
func (h *Host) Run(cmd string) (string, error) { return h.run(cmd) }

// Virsh runs virsh against the host's system libvirtd; args is shell text.
func (h *Host) Virsh(args string) (string, error) {
	return h.run("virsh -q -c qemu:///system " + args)
}

// Domains lists every domain's name, running or not.
func (h *Host) Domains() ([]string, error) {
	out, err := h.Virsh("list --all --name")
	return strings.Fields(out), err
}

// Volumes lists the names of the volumes in the host's pool.
func (h *Host) Volumes() ([]string, error) {
	out, err := h.Virsh("vol-list --pool " + h.Env.Pool)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, err
}

// DiskWrites is the number of write requests domain vm has made to its disk vda.
func (h *Host) DiskWrites(vm string) (int, error) {
	out, err := h.Virsh("domstats --block " + vm)
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

// DomainsMatching lists the domains whose XML contains text (a UID in the ownership mark,
// an install's element).
func (h *Host) DomainsMatching(text string) ([]string, error) {
	out, err := h.run(fmt.Sprintf(`for d in $(virsh -q -c qemu:///system list --all --name); do `+
		`virsh -q -c qemu:///system dumpxml "$d" | grep -qF %q && echo "$d"; done; true`, text))
	return strings.Fields(out), err
}

// Leftovers lists what remains of instance vm: its domain, its volumes, files in the pool
// directory and its NVRAM copy. The NVRAM directory is read locally: only root and QEMU's
// user may enter libvirt's state directory, and the host is this machine.
func (h *Host) Leftovers(vm string) []string {
	var left []string
	doms, err := h.Domains()
	if err != nil {
		left = append(left, "listing domains: "+err.Error())
	}
	for _, d := range doms {
		if d == vm {
			left = append(left, "domain "+d)
		}
	}
	vols, err := h.Volumes()
	if err != nil {
		left = append(left, "listing volumes: "+err.Error())
	}
	for _, v := range vols {
		if strings.HasPrefix(v, vm) {
			left = append(left, "volume "+v)
		}
	}
	files, err := h.run("ls -1 " + h.Env.PoolPath)
	if err != nil {
		left = append(left, "listing the pool directory: "+err.Error())
	}
	for _, f := range strings.Fields(files) {
		if strings.HasPrefix(f, vm) {
			left = append(left, "file "+filepath.Join(h.Env.PoolPath, f))
		}
	}
	nv, _ := filepath.Glob(filepath.Join(NVRAMDir, vm+"*"))
	for _, f := range nv {
		left = append(left, "nvram "+f)
	}
	return left
}

// RemoveInstance deletes domain vm and its volumes, whatever state they are in.
func (h *Host) RemoveInstance(vm string) {
	_, _ = h.Virsh("destroy " + vm)
	_, _ = h.Virsh("undefine --nvram --managed-save " + vm)
	for _, v := range []string{vm + ".qcow2", vm + "-seed.iso"} {
		_, _ = h.Virsh(fmt.Sprintf("vol-delete --pool %s %s", h.Env.Pool, v))
	}
}

// RemoveBaseImage deletes the cached copy of catalogue image key, so the next Create
// downloads it again.
func (h *Host) RemoveBaseImage(key string) {
	for _, v := range []string{"base-" + key + ".qcow2", "base-" + key + ".qcow2.sha256"} {
		_, _ = h.Virsh(fmt.Sprintf("vol-delete --pool %s %s", h.Env.Pool, v))
	}
}

// GuestExec runs path with args on domain vm through the QEMU guest agent and returns its
// output (stdout, then stderr) and exit code once it has exited.
func (h *Host) GuestExec(vm, path string, args ...string) (string, int, error) {
	req, _ := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": map[string]any{"path": path, "arg": args, "capture-output": true}})
	out, err := h.Virsh(fmt.Sprintf("qemu-agent-command %s '%s'", vm, req))
	if err != nil {
		return "", -1, err
	}
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &started); err != nil {
		return "", -1, fmt.Errorf("guest-exec %s on %s: %q: %w", path, vm, out, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := h.Virsh(fmt.Sprintf(`qemu-agent-command %s '{"execute":"guest-exec-status","arguments":{"pid":%d}}'`, vm, started.Return.PID))
		if err != nil {
			return "", -1, err
		}
		var res struct {
			Return struct {
				Exited   bool   `json:"exited"`
				ExitCode int    `json:"exitcode"`
				Out      string `json:"out-data"`
				Err      string `json:"err-data"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(st), &res); err != nil {
			return "", -1, fmt.Errorf("guest-exec-status of %s on %s: %q: %w", path, vm, st, err)
		}
		if res.Return.Exited {
			o, _ := base64.StdEncoding.DecodeString(res.Return.Out)
			e, _ := base64.StdEncoding.DecodeString(res.Return.Err)
			return string(o) + string(e), res.Return.ExitCode, nil
		}
		if time.Now().After(deadline) {
			return "", -1, fmt.Errorf("%s on %s has not exited after a minute", path, vm)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
