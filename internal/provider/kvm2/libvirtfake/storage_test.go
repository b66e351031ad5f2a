package libvirtfake

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

func volXML(name, format string, capacity uint64, extra string) string {
	return "<volume><name>" + name + "</name><capacity unit='bytes'>" + strconv.FormatUint(capacity, 10) +
		"</capacity><target><format type='" + format + "'/></target>" + extra + "</volume>"
}

func defaultPool(t *testing.T, f *Fake) libvirt.StoragePool {
	t.Helper()
	p, err := f.StoragePoolLookupByName(DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoolInfoTracksVolumes(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	state, capacity, alloc, avail, err := f.StoragePoolGetInfo(p)
	if err != nil || libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning || capacity != DefaultPoolSize ||
		alloc != 0 || avail != DefaultPoolSize {
		t.Fatalf("empty pool: %d %d %d %d %v", state, capacity, alloc, avail, err)
	}
	raw, err := f.StorageVolCreateXML(p, volXML("seed.iso", "raw", 1<<20, ""), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.StorageVolCreateXML(p, volXML("disk.qcow2", "qcow2", 10<<30, ""), 0); err != nil {
		t.Fatal(err)
	}
	_, _, alloc, avail, _ = f.StoragePoolGetInfo(p)
	if alloc != 1<<20 || avail != DefaultPoolSize-1<<20 {
		t.Fatalf("raw volume is fully allocated, qcow2 thin: alloc %d avail %d", alloc, avail)
	}
	if err := f.StorageVolDelete(raw, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, alloc, _, _ = f.StoragePoolGetInfo(p); alloc != 0 {
		t.Fatalf("after delete alloc %d", alloc)
	}
}

func TestVolumeLookupPathAndErrors(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, err := f.StorageVolCreateXML(p, "<volume><name>a.img</name><capacity unit='MiB'>2</capacity></volume>", 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.Key != DefaultPoolPath+"/a.img" {
		t.Fatalf("key %q", v.Key)
	}
	if path, _ := f.StorageVolGetPath(v); path != DefaultPoolPath+"/a.img" {
		t.Fatalf("path %q", path)
	}
	if typ, c, a, _ := f.StorageVolGetInfo(v); typ != int8(libvirt.StorageVolFile) || c != 2<<20 || a != 2<<20 {
		t.Fatalf("info %d %d %d", typ, c, a)
	}
	_, err = f.StorageVolCreateXML(p, "<volume><name>a.img</name><capacity>1</capacity></volume>", 0)
	wantCode(t, err, libvirt.ErrStorageVolExist, "storage volume 'a.img' exists already")
	_, err = f.StorageVolLookupByName(p, "nope")
	wantCode(t, err, libvirt.ErrNoStorageVol, "Storage volume not found: no storage vol with matching name 'nope'")
	_, err = f.StoragePoolLookupByName("nope")
	wantCode(t, err, libvirt.ErrNoStoragePool, "Storage pool not found: no storage pool with matching name 'nope'")
	_, err = f.StorageVolCreateXML(p, "<volume><name>b</name></volume>", 0)
	wantCode(t, err, libvirt.ErrXMLError, "XML error: missing capacity element")

	if err := f.SetPoolActive(DefaultPool, false); err != nil {
		t.Fatal(err)
	}
	_, err = f.StorageVolLookupByName(p, "a.img")
	wantCode(t, err, libvirt.ErrOperationInvalid, "Requested operation is not valid: storage pool 'default' is not active")
	_, err = f.StorageVolGetPath(v)
	wantCode(t, err, libvirt.ErrOperationInvalid, "")
	wantCode(t, f.StoragePoolRefresh(p, 0), libvirt.ErrOperationInvalid, "")
	if state, _, _, _, err := f.StoragePoolGetInfo(p); err != nil || libvirt.StoragePoolState(state) != libvirt.StoragePoolInactive {
		t.Fatalf("inactive pool info: %d %v", state, err)
	}
}

func TestBackingStoreMustExist(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	overlay := func(path string) string {
		return volXML("vm.qcow2", "qcow2", 10<<30, "<backingStore><path>"+path+"</path><format type='qcow2'/></backingStore>")
	}
	_, err := f.StorageVolCreateXML(p, overlay(DefaultPoolPath+"/base.qcow2"), 0)
	wantCode(t, err, libvirt.ErrSystemError, "")
	_ = f.PutVolume(DefaultPool, VolumeInfo{Name: "base.qcow2", Format: "qcow2", Content: []byte("x")})
	if _, err := f.StorageVolCreateXML(p, overlay(DefaultPoolPath+"/base.qcow2"), 0); err != nil {
		t.Fatal(err)
	}
	got, _ := f.Volume(DefaultPool, "vm.qcow2")
	if got.BackingStore != DefaultPoolPath+"/base.qcow2" || got.BackingFormat != "qcow2" || got.Format != "qcow2" {
		t.Fatalf("overlay %+v", got)
	}
}

func TestUploadDownloadRoundTrip(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	data := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // 1.6 MB, several chunks
	v, _ := f.StorageVolCreateXML(p, volXML("img", "raw", uint64(len(data)), ""), 0)
	if err := f.StorageVolUpload(v, bytes.NewReader(data), 0, uint64(len(data)), 0); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := f.StorageVolDownload(v, &out, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes differ from the %d uploaded", out.Len(), len(data))
	}
	out.Reset()
	_ = f.StorageVolDownload(v, &out, 16, 32, 0)
	if !bytes.Equal(out.Bytes(), data[16:48]) {
		t.Fatalf("ranged download %q", out.Bytes())
	}
	ups := f.Uploads()
	if len(ups) != 1 || !ups[0].Done || ups[0].Err != nil || ups[0].Received != uint64(len(data)) || ups[0].Volume != "img" {
		t.Fatalf("uploads %+v", ups)
	}
}

func TestShortUploadIsAcceptedAndRecorded(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("seed.iso", "raw", 100, ""), 0)
	if err := f.StorageVolUpload(v, bytes.NewReader(make([]byte, 40)), 0, 100, 0); err != nil {
		t.Fatalf("a short stream failed: %v", err)
	}
	if u := f.Uploads()[0]; u.Received != 40 || u.Length != 100 {
		t.Fatalf("recorded %+v", u)
	}
}

func TestUploadPastLengthFails(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("m", "raw", 64, ""), 0)
	err := f.StorageVolUpload(v, bytes.NewReader(make([]byte, 65)), 0, 64, 0)
	wantCode(t, err, libvirt.ErrSystemError, "cannot write to stream: No space left on device")
	if u := f.Uploads()[0]; !u.Done || u.Err == nil {
		t.Fatalf("recorded %+v", u)
	}
}

func TestUploadFillingThePoolFails(t *testing.T) {
	f := New()
	_ = f.SetPoolCapacity(DefaultPool, 1<<20)
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("img.qcow2", "qcow2", 10<<20, ""), 0)
	err := f.StorageVolUpload(v, bytes.NewReader(make([]byte, 2<<20)), 0, 0, 0)
	wantCode(t, err, libvirt.ErrSystemError, "")
	if u := f.Uploads()[0]; u.Received >= 2<<20 {
		t.Fatalf("received %d bytes into a 1 MiB pool", u.Received)
	}
}

type failingReader struct{ n int }

func (r *failingReader) Read(b []byte) (int, error) {
	if r.n == 0 {
		return 0, errors.New("mirror reset the connection")
	}
	r.n--
	return copy(b, "abcd"), nil
}

func TestUploadReaderErrorAborts(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("img", "raw", 100, ""), 0)
	err := f.StorageVolUpload(v, &failingReader{n: 2}, 0, 100, 0)
	if err == nil || err.Error() != "mirror reset the connection" {
		t.Fatalf("upload returned %v, want the body's own error", err)
	}
	if u := f.Uploads()[0]; u.Received != 8 || u.Err != errClientAbort {
		t.Fatalf("recorded %+v", u)
	}
}

func TestVolumeInUseCannotBeDeleted(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("img", "raw", 100, ""), 0)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- f.StorageVolUpload(v, pr, 0, 0, 0) }()
	_, _ = pw.Write([]byte("partial"))
	wantCode(t, f.StorageVolDelete(v, 0), libvirt.ErrOperationInvalid, "Requested operation is not valid: volume 'img' is still in use.")
	_ = pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := f.StorageVolDelete(v, 0); err != nil {
		t.Fatalf("delete after the upload: %v", err)
	}
}

func TestRefreshProbesQcow2(t *testing.T) {
	f := New()
	p := defaultPool(t, f)
	v, _ := f.StorageVolCreateXML(p, volXML("base", "raw", 4096, ""), 0)
	_ = f.StorageVolUpload(v, bytes.NewReader(Qcow2(2<<30, 4096)), 0, 0, 0)
	if got, _ := f.Volume(DefaultPool, "base"); got.Format != "raw" {
		t.Fatalf("format before refresh %q", got.Format)
	}
	if err := f.StoragePoolRefresh(p, 0); err != nil {
		t.Fatal(err)
	}
	got, _ := f.Volume(DefaultPool, "base")
	if got.Format != "qcow2" || got.Capacity != 2<<30 {
		t.Fatalf("after refresh %q %d", got.Format, got.Capacity)
	}
}
