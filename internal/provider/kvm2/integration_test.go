//go:build integration

package kvm2

import (
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
)

// TestKVM2Check_realHost runs the health check against the host and creates nothing.
func TestKVM2Check_realHost(t *testing.T) {
	e := itNewRealEnv(t, "check")
	p := e.newProvider(itEnvOptions{})
	st := itCheckOne(t, p)
	if !st.Ready || st.Reason != reasonReachable || st.Message != "" {
		t.Fatalf("check: ready=%v reason=%s message=%q, want a Reachable host", st.Ready, st.Reason, st.Message)
	}
	d := st.Details
	if d["user"] != e.host.user || d["pool"] != e.host.pool {
		t.Errorf("details user=%q pool=%q, want %q and %q", d["user"], d["pool"], e.host.user, e.host.pool)
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(d["libvirtVersion"]) {
		t.Errorf("libvirtVersion %q is not major.minor.micro", d["libvirtVersion"])
	}
	if want := strings.Fields(itMustVirsh(t, "version", "--daemon")); !strings.Contains(strings.Join(want, " "), "libvirt "+d["libvirtVersion"]) {
		t.Errorf("libvirtVersion %q, but virsh version --daemon says %q", d["libvirtVersion"], strings.Join(want, " "))
	}
	if hn, _ := os.Hostname(); d["hostname"] == "" || !strings.HasPrefix(d["hostname"], strings.Split(hn, ".")[0]) {
		t.Errorf("hostname %q, want this machine's (%q)", d["hostname"], hn)
	}
	if d["poolState"] != "running" {
		t.Errorf("poolState %q, want running", d["poolState"])
	}
	capacity, err1 := strconv.ParseFloat(d["poolCapacityGiB"], 64)
	available, err2 := strconv.ParseFloat(d["poolAvailableGiB"], 64)
	if err1 != nil || err2 != nil || capacity <= 0 || available <= 0 || available > capacity {
		t.Errorf("pool sizes capacity=%q available=%q, want 0 < available <= capacity", d["poolCapacityGiB"], d["poolAvailableGiB"])
	}
	if st.Latency <= 0 {
		t.Errorf("latency %s", st.Latency)
	}
	t.Logf("check: %s in %s, details %v", st.Reason, st.Latency, d)
	// Read-only calls only, on a connection of its own: the check creates nothing.
	want := map[string]int64{"ConnectGetLibVersion": 1, "ConnectGetHostname": 1, "StoragePoolLookupByName": 1, "StoragePoolGetInfo": 1}
	if diff := cmp.Diff(want, p.hosts.rpcs.methods()); diff != "" {
		t.Errorf("the check's RPCs, by method (-want +got):\n%s", diff)
	}
	if n := e.dials.Load(); n != 1 {
		t.Errorf("the check dialled %d times, want once", n)
	}
}

func itContainsToken(list []string, token string) bool {
	for _, s := range list {
		if strings.Contains(s, token) {
			return true
		}
	}
	return false
}

// itDumpedDomain is the part of `virsh dumpxml` the lifecycle test looks at.
type itDumpedDomain struct {
	Type string `xml:"type,attr"`
	OS   struct {
		Firmware string `xml:"firmware,attr"`
		Type     struct {
			Machine string `xml:"machine,attr"`
		} `xml:"type"`
		Loader string `xml:"loader"`
		NVRAM  string `xml:"nvram"`
	} `xml:"os"`
	Disks []struct {
		Type   string `xml:"type,attr"`
		Device string `xml:"device,attr"`
		Source struct {
			File string `xml:"file,attr"`
		} `xml:"source"`
		Target struct {
			Dev string `xml:"dev,attr"`
			Bus string `xml:"bus,attr"`
		} `xml:"target"`
		ReadOnly *struct{} `xml:"readonly"`
	} `xml:"devices>disk"`
	Interfaces []struct {
		Type   string `xml:"type,attr"`
		Source struct {
			Bridge string `xml:"bridge,attr"`
		} `xml:"source"`
	} `xml:"devices>interface"`
	Channels []struct {
		Target struct {
			Name  string `xml:"name,attr"`
			State string `xml:"state,attr"`
		} `xml:"target"`
	} `xml:"devices>channel"`
	Metadata struct {
		Inner string `xml:",innerxml"`
	} `xml:"metadata"`
}

// TestKVM2Lifecycle_realHost creates a domain, reads it back with virsh, gets it and
// deletes it: everything the Proxy owned goes, the cached image stays.
func TestKVM2Lifecycle_realHost(t *testing.T) {
	e := itNewRealEnv(t, "life")
	t.Cleanup(e.removeImage)
	p := e.newProvider(itEnvOptions{diskSizeGb: 1})
	req := e.request(e.names.vm(1), "uid-life-1")

	inst, err := createSettled(itCtxFor(t), p, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	wantID := "hosts/" + integrationHost + "/domains/" + req.Name
	if inst.ProviderID != wantID || inst.State != provider.StateRunning || inst.UID != req.UID {
		t.Fatalf("create returned %+v, want providerID %s, Running, uid %s", inst, wantID, req.UID)
	}
	if state := strings.TrimSpace(itMustVirsh(t, "domstate", req.Name)); state != "running" {
		t.Fatalf("virsh domstate %s: %q, want running", req.Name, state)
	}

	overlay := filepath.Join(e.host.poolPath, req.Name+".qcow2")
	seed := filepath.Join(e.host.poolPath, req.Name+"-seed.iso")
	base := filepath.Join(e.host.poolPath, imagecache.BaseVolName(e.names.image(), "qcow2"))
	var dom itDumpedDomain
	if err := xml.Unmarshal([]byte(itMustVirsh(t, "dumpxml", req.Name)), &dom); err != nil {
		t.Fatal(err)
	}
	itCheckDumpedDomain(t, e, dom, req.UID, overlay, seed)

	e.checkDisks(t, overlay, seed, base)
	nvram := dom.OS.NVRAM
	if nvram == "" {
		t.Fatalf("a UEFI domain has no NVRAM file in its xml")
	}
	if _, err := os.Stat(nvram); err != nil {
		t.Fatalf("NVRAM file of the running domain: %v", err)
	}

	e.checkGetRunning(t, p, inst.ProviderID, req.UID)
	e.checkStoppedAndRestart(t, p, req, inst.ProviderID)

	if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	e.checkDeleted(t, p, req.Name, inst.ProviderID, nvram)
}

// checkDisks checks the VM's disks as the host sees them: the overlay is a qcow2 backed
// by the cached base, as libvirt and qemu-img report it, and the seed a NoCloud ISO.
func (e *itRealEnv) checkDisks(t *testing.T, overlay, seed, base string) {
	t.Helper()
	vol := itMustVirsh(t, "vol-dumpxml", "--pool", e.host.pool, filepath.Base(overlay))
	if !strings.Contains(vol, "<backingStore>") || !strings.Contains(vol, "<path>"+base+"</path>") {
		t.Errorf("overlay volume xml has no backing store %s:\n%s", base, vol)
	}
	if out := itRunCmd(t, "qemu-img", "info", "-U", "--output=json", overlay); !strings.Contains(out, `"backing-filename": "`+base+`"`) ||
		!strings.Contains(out, `"virtual-size": 1073741824`) {
		t.Errorf("qemu-img info of the overlay: want backing file %s and 1 GiB:\n%s", base, out)
	}
	if out := itRunCmd(t, "isoinfo", "-d", "-i", seed); !strings.Contains(out, "Volume id: cidata") {
		t.Errorf("seed %s is not labelled cidata:\n%s", seed, out)
	}
}

// checkStoppedAndRestart shuts the domain off on the host: Get says Stopped with the
// owner, and a repeat Create adopts the same domain and starts it again.
func (e *itRealEnv) checkStoppedAndRestart(t *testing.T, p *Provider, req provider.CreateRequest, id string) {
	t.Helper()
	uuid := strings.TrimSpace(itMustVirsh(t, "domuuid", req.Name))
	itMustVirsh(t, "destroy", req.Name)
	got, err := p.Get(itCtxFor(t), id)
	if err != nil {
		t.Fatalf("get of the shut-off domain: %v", err)
	}
	if got.State != provider.StateStopped || got.UID != req.UID || got.IP != "" || got.ProviderID != id {
		t.Fatalf("get of the shut-off domain returned %+v, want Stopped with uid %s", got, req.UID)
	}
	if got.CreatedAt.IsZero() || time.Since(got.CreatedAt) > time.Hour {
		t.Errorf("get: createdAt %s", got.CreatedAt)
	}
	again, err := createSettled(itCtxFor(t), p, req)
	if err != nil {
		t.Fatalf("repeat create of the shut-off domain: %v", err)
	}
	if again.State != provider.StateRunning || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Errorf("repeat create returned %+v, want Running with the original createdAt %s", again, got.CreatedAt)
	}
	if state := strings.TrimSpace(itMustVirsh(t, "domstate", req.Name)); state != "running" {
		t.Fatalf("after the repeat create virsh domstate says %q", state)
	}
	if u := strings.TrimSpace(itMustVirsh(t, "domuuid", req.Name)); u != uuid {
		t.Errorf("the repeat create replaced the domain (uuid %s, was %s)", u, uuid)
	}
}

// checkDeleted checks what Delete leaves of domain name: no domain, overlay, seed or NVRAM
// file, the cached base and its marker, and NotFound from Get; a second Delete succeeds.
func (e *itRealEnv) checkDeleted(t *testing.T, p *Provider, name, id, nvram string) {
	t.Helper()
	if itHasDomain(name) {
		t.Errorf("domain %s is still defined after Delete", name)
	}
	for _, v := range []string{name + ".qcow2", name + "-seed.iso"} {
		if e.hasVolume(v) {
			t.Errorf("volume %s is still in the pool after Delete", v)
		}
	}
	if _, err := os.Stat(nvram); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("NVRAM file %s after Delete: %v, want it gone", nvram, err)
	}
	for _, v := range []string{imagecache.BaseVolName(e.names.image(), "qcow2"), imagecache.MarkerVolName(e.names.image(), "qcow2")} {
		if !e.hasVolume(v) {
			t.Errorf("cached %s is gone after Delete; it must stay for the next VM", v)
		}
	}
	_, err := p.Get(itCtxFor(t), id)
	itWantErr(t, err, provider.ErrNotFound, "domain "+name+" not found on host "+integrationHost)
	if err := p.Delete(itCtxFor(t), id); err != nil {
		t.Fatalf("a second delete of a gone domain: %v", err)
	}
}

// checkGetRunning gets a running domain that has no guest agent. Its address comes from
// the host's ARP table then; where libvirt cannot read that table (it fails with "wrong
// nlmsg len" on some kernels) no source answers and Get is transient by design, so the
// state and owner are checked through the listing instead.
func (e *itRealEnv) checkGetRunning(t *testing.T, p *Provider, id, uid string) {
	t.Helper()
	got, err := p.Get(itCtxFor(t), id)
	if err == nil {
		if got.State != provider.StateRunning || got.UID != uid || got.ProviderID != id {
			t.Fatalf("get returned %+v, want Running with uid %s", got, uid)
		}
		return
	}
	itWantErr(t, err, provider.ErrTransient, "no address source answered", "agent:", "arp:")
	t.Logf("get of a running domain without agent on this host: %v", err)
	list, err := p.ListByTag(itCtxFor(t))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, in := range list {
		if in.ProviderID == id {
			if in.State != provider.StateRunning || in.UID != uid {
				t.Fatalf("listed %+v, want Running with uid %s", in, uid)
			}
			return
		}
	}
	t.Fatalf("the listing %v misses %s", list, id)
}

func itCheckDumpedDomain(t *testing.T, e *itRealEnv, dom itDumpedDomain, uid, overlay, seed string) {
	t.Helper()
	if dom.Type != e.host.domainType {
		t.Errorf("domain type %q, want %q", dom.Type, e.host.domainType)
	}
	if !strings.Contains(dom.OS.Type.Machine, "q35") {
		t.Errorf("machine %q, want a q35 machine", dom.OS.Type.Machine)
	}
	// libvirt resolves firmware="efi" into the OVMF loader it picked.
	if dom.OS.Firmware != "efi" && !strings.Contains(dom.OS.Loader, "OVMF") {
		t.Errorf("os firmware %q, loader %q: want UEFI (OVMF)", dom.OS.Firmware, dom.OS.Loader)
	}
	disks := map[string]int{}
	for i, d := range dom.Disks {
		disks[d.Target.Dev] = i
	}
	vda, okA := disks["vda"]
	sda, okB := disks["sda"]
	if !okA || !okB || len(dom.Disks) != 2 {
		t.Fatalf("disks %+v, want exactly vda and sda", dom.Disks)
	}
	if d := dom.Disks[vda]; d.Type != "file" || d.Device != "disk" || d.Source.File != overlay || d.Target.Bus != "virtio" || d.ReadOnly != nil {
		t.Errorf("vda %+v, want a writable virtio file disk on %s", d, overlay)
	}
	if d := dom.Disks[sda]; d.Type != "file" || d.Device != "cdrom" || d.Source.File != seed || d.Target.Bus != "sata" || d.ReadOnly == nil {
		t.Errorf("sda %+v, want a read-only sata cdrom file on %s", d, seed)
	}
	if len(dom.Interfaces) != 1 || dom.Interfaces[0].Type != "bridge" || dom.Interfaces[0].Source.Bridge != e.host.bridge {
		t.Errorf("interfaces %+v, want one on bridge %s", dom.Interfaces, e.host.bridge)
	}
	agent := false
	for _, c := range dom.Channels {
		agent = agent || c.Target.Name == "org.qemu.guest_agent.0"
	}
	if !agent {
		t.Errorf("channels %+v, want org.qemu.guest_agent.0", dom.Channels)
	}
	if !strings.Contains(dom.Metadata.Inner, MetadataURI(provider.TypeKVM2)) || !strings.Contains(dom.Metadata.Inner, "<uid>"+uid+"</uid>") ||
		!strings.Contains(dom.Metadata.Inner, "managed>true<") {
		t.Errorf("metadata %s, want the kvm2 mark with uid %s", dom.Metadata.Inner, uid)
	}
}

func itRunCmd(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := itExecOutput(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return out
}
