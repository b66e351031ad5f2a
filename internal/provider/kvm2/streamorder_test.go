package kvm2

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

const (
	procDownload   = 209 // REMOTE_PROC_STORAGE_VOL_DOWNLOAD
	procUpload     = 208 // REMOTE_PROC_STORAGE_VOL_UPLOAD
	procGetVersion = 157 // REMOTE_PROC_CONNECT_GET_LIB_VERSION
	stOK           = 0
	stError        = 1
	stContinue     = 2
)

// lvPacket frames one libvirt packet.
func lvPacket(proc, typ uint32, serial int32, status uint32, payload string) []byte {
	b := make([]byte, lvHeaderLen, lvHeaderLen+len(payload))
	for i, v := range []uint32{uint32(lvHeaderLen + len(payload)), lvRemoteProgram, 1, proc, typ, uint32(serial), status} {
		binary.BigEndian.PutUint32(b[4*i:], v)
	}
	return append(b, payload...)
}

// scriptConn is the far end of a connection: reads return the scripted bytes in chunks of
// at most chunk bytes, writes are recorded.
type scriptConn struct {
	net.Conn
	mu      sync.Mutex
	in      []byte
	chunk   int
	written bytes.Buffer
	closed  bool
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.chunk)], c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written.Write(p)
}

func (c *scriptConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.UnixAddr{Name: "/run/libvirt/libvirt-sock", Net: "unix"}
}

// exchange writes the calls through a streamOrderConn (each call split at every byte when
// split is set), then reads everything the far end sends back through it, with reads of
// readSize bytes, and returns what the reader saw and the error that ended the reading.
func exchange(t *testing.T, calls [][]byte, replies [][]byte, split bool, readSize int) ([]byte, error) {
	t.Helper()
	far := &scriptConn{in: bytes.Join(replies, nil), chunk: 1 << 20}
	if split {
		far.chunk = 1
	}
	s := newStreamOrderConn(far)
	var sent []byte
	for _, c := range calls {
		sent = append(sent, c...)
		parts := [][]byte{c}
		if split {
			parts = parts[:0]
			for i := range c {
				parts = append(parts, c[i:i+1])
			}
		}
		for _, p := range parts {
			if n, err := s.Write(p); err != nil || n != len(p) {
				t.Fatalf("write of %d bytes: %d, %v", len(p), n, err)
			}
		}
	}
	if !bytes.Equal(far.written.Bytes(), sent) {
		t.Fatalf("the far end got %d bytes that differ from the %d written", far.written.Len(), len(sent))
	}
	var got []byte
	buf := make([]byte, readSize)
	for {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}

func expectOrder(t *testing.T, got []byte, want ...[]byte) {
	t.Helper()
	if w := bytes.Join(want, nil); !bytes.Equal(got, w) {
		t.Fatalf("reader saw %d bytes:\n%x\nwant %d bytes:\n%x", len(got), got, len(w), w)
	}
}

func TestStreamOrderReplyMovesAheadOfEarlyDownloadData(t *testing.T) {
	call := lvPacket(procDownload, lvTypeCall, 5, stOK, "args")
	data := lvPacket(procDownload, lvTypeStream, 5, stContinue, "marker-bytes")
	end := lvPacket(procDownload, lvTypeStream, 5, stContinue, "")
	reply := lvPacket(procDownload, lvTypeReply, 5, stOK, "")
	got, err := exchange(t, [][]byte{call}, [][]byte{data, end, reply}, false, 4096)
	if err != io.EOF {
		t.Fatalf("read ended with %v, want EOF", err)
	}
	expectOrder(t, got, reply, data, end)
}

func TestStreamOrderLeavesNormalOrderAlone(t *testing.T) {
	call := lvPacket(procDownload, lvTypeCall, 5, stOK, "args")
	reply := lvPacket(procDownload, lvTypeReply, 5, stOK, "")
	data := lvPacket(procDownload, lvTypeStream, 5, stContinue, "marker-bytes")
	end := lvPacket(procDownload, lvTypeStream, 5, stContinue, "")
	// A stream packet on a serial no stream call used passes as it came.
	stray := lvPacket(procDownload, lvTypeStream, 9, stContinue, "x")
	got, err := exchange(t, [][]byte{call}, [][]byte{reply, data, stray, end}, false, 4096)
	if err != io.EOF {
		t.Fatalf("read ended with %v, want EOF", err)
	}
	expectOrder(t, got, reply, data, stray, end)
}

func TestStreamOrderErrorReplyEndsTheWait(t *testing.T) {
	call := lvPacket(procDownload, lvTypeCall, 7, stOK, "args")
	data := lvPacket(procDownload, lvTypeStream, 7, stContinue, "early")
	fail := lvPacket(procDownload, lvTypeReply, 7, stError, "no such volume")
	after := lvPacket(procDownload, lvTypeStream, 7, stContinue, "late")
	got, err := exchange(t, [][]byte{call}, [][]byte{data, fail, after}, false, 4096)
	if err != io.EOF {
		t.Fatalf("read ended with %v, want EOF", err)
	}
	// The error reply goes first; after it the serial is no longer waited for.
	expectOrder(t, got, fail, data, after)
}

func TestStreamOrderSplitWritesAndReads(t *testing.T) {
	// An upload call, then its data in large stream packets, then a download call, all
	// written a byte at a time: the download serial must still be recognised.
	big := strings.Repeat("u", 70000)
	calls := [][]byte{
		lvPacket(procUpload, lvTypeCall, 3, stOK, "args"),
		lvPacket(procUpload, lvTypeStream, 3, stContinue, big),
		lvPacket(procUpload, lvTypeStream, 3, stContinue, big[:12345]),
		lvPacket(procDownload, lvTypeCall, 4, stOK, "args"),
	}
	upReply := lvPacket(procUpload, lvTypeReply, 3, stOK, "")
	data := lvPacket(procDownload, lvTypeStream, 4, stContinue, "marker")
	end := lvPacket(procDownload, lvTypeStream, 4, stContinue, "")
	reply := lvPacket(procDownload, lvTypeReply, 4, stOK, "")
	upDone := lvPacket(procUpload, lvTypeStream, 3, stOK, "")
	got, err := exchange(t, calls, [][]byte{upReply, data, end, upDone, reply}, true, 3)
	if err != io.EOF {
		t.Fatalf("read ended with %v, want EOF", err)
	}
	expectOrder(t, got, upReply, upDone, reply, data, end)
}

func TestStreamOrderOtherRepliesOvertakeHeldData(t *testing.T) {
	calls := [][]byte{
		lvPacket(procDownload, lvTypeCall, 5, stOK, "args"),
		lvPacket(procGetVersion, lvTypeCall, 6, stOK, ""),
		lvPacket(procGetVersion, lvTypeCall, 8, stOK, ""),
	}
	data := lvPacket(procDownload, lvTypeStream, 5, stContinue, "marker")
	v6 := lvPacket(procGetVersion, lvTypeReply, 6, stOK, "v6")
	v8 := lvPacket(procGetVersion, lvTypeReply, 8, stOK, "v8")
	end := lvPacket(procDownload, lvTypeStream, 5, stContinue, "")
	reply := lvPacket(procDownload, lvTypeReply, 5, stOK, "")
	got, err := exchange(t, calls, [][]byte{data, v6, end, reply, v8}, false, 4096)
	if err != io.EOF {
		t.Fatalf("read ended with %v, want EOF", err)
	}
	expectOrder(t, got, v6, reply, data, end, v8)
}

func TestStreamOrderFailsBeyondTheBound(t *testing.T) {
	far := &scriptConn{chunk: 1 << 20}
	s := newStreamOrderConn(far)
	s.limit = 100
	if _, err := s.Write(lvPacket(procDownload, lvTypeCall, 5, stOK, "args")); err != nil {
		t.Fatal(err)
	}
	before := lvPacket(procGetVersion, lvTypeReply, 2, stOK, "v")
	far.in = bytes.Join([][]byte{before,
		lvPacket(procDownload, lvTypeStream, 5, stContinue, strings.Repeat("d", 60)),
		lvPacket(procDownload, lvTypeStream, 5, stContinue, strings.Repeat("d", 60)),
		lvPacket(procDownload, lvTypeReply, 5, stOK, "")}, nil)
	var got []byte
	buf := make([]byte, 4096)
	var err error
	for err == nil {
		var n int
		n, err = s.Read(buf)
		got = append(got, buf[:n]...)
	}
	expectOrder(t, got, before)
	if err == io.EOF || !strings.Contains(err.Error(), "before the call's reply") ||
		!strings.Contains(err.Error(), "/run/libvirt/libvirt-sock") {
		t.Fatalf("read ended with %v, want the held-bytes bound naming the socket", err)
	}
	if !far.closed {
		t.Fatal("the connection was left open after the bound was exceeded")
	}
	if _, again := s.Read(buf); again != err {
		t.Fatalf("a later read returned %v, want the same error", again)
	}
}

// TestGoLibvirtDownloadWithReplyLast runs go-libvirt over the socket the provider hands it
// against a libvirt that sends a download's data before the call's reply: every download
// returns the volume's bytes and the connection keeps answering calls.
func TestGoLibvirtDownloadWithReplyLast(t *testing.T) {
	f := libvirtfake.New()
	marker := bytes.Repeat([]byte("0123456789abcdef"), 4)
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: "marker", Content: marker}); err != nil {
		t.Fatal(err)
	}
	f.SendStreamBeforeReply(true)
	pipe, err := f.Dial()
	if err != nil {
		t.Fatal(err)
	}
	l := libvirt.NewWithDialer(&forwardedSocket{conn: pipe})
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.Disconnect()
		_ = pipe.Close()
	})
	pool, err := l.StoragePoolLookupByName(libvirtfake.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := l.StorageVolLookupByName(pool, "marker")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		var buf bytes.Buffer
		done := make(chan error, 1)
		go func() { done <- l.StorageVolDownload(vol, &buf, 0, 0, 0) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("download %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("download %d did not return within 30s: the connection is stuck", i)
		}
		if !bytes.Equal(buf.Bytes(), marker) {
			t.Fatalf("download %d returned %q, want %q", i, buf.Bytes(), marker)
		}
		if host, err := l.ConnectGetHostname(); err != nil || host != libvirtfake.DefaultHostname {
			t.Fatalf("after download %d the connection answers %q, %v", i, host, err)
		}
	}
	if got := f.Calls("StorageVolDownload"); got != 30 {
		t.Fatalf("the fake served %d downloads, want 30", got)
	}
}
