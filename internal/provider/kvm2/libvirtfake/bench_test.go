package libvirtfake

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// BenchmarkRPCThroughSSH measures one libvirt round trip
// (ConnectGetLibVersion) from go-libvirt's client through the in-process SSH
// server into the fake.
func BenchmarkRPCThroughSSH(b *testing.B) {
	l, _, _ := overSSH(b, New())
	for b.Loop() {
		if _, err := l.ConnectGetLibVersion(); err != nil {
			b.Fatal(err)
		}
	}
}

const rawSocket = "/run/sshtest/raw.sock"

// rawSink reads a forwarded stream to its end and answers with one byte, so
// the sender knows every byte arrived.
func rawSink(c net.Conn) {
	if _, err := io.Copy(io.Discard, c); err == nil {
		_, _ = c.Write([]byte{1})
	}
}

type closeWriter interface{ CloseWrite() error }

func rawCopy(dial func() (net.Conn, error), data []byte) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write(data); err != nil {
		return err
	}
	if err := c.(closeWriter).CloseWrite(); err != nil {
		return err
	}
	_, err = io.ReadFull(c, make([]byte, 1))
	return err
}

// BenchmarkUploadVsRawCopy uploads 32 MiB with StorageVolUpload through the
// SSH server into the fake, and copies the same bytes through the same SSH
// connection into a forwarded socket that only reads them. It reports both
// throughputs and their ratio: the cost of libvirt's stream protocol and
// go-libvirt's client over the bare forwarded channel.
func BenchmarkUploadVsRawCopy(b *testing.B) {
	const size = 32 << 20
	f := New()
	l, env, client := overSSH(b, f)
	env.Handle(rawSocket, rawSink)
	data := randomBytes(b, size)
	pool, _ := l.StoragePoolLookupByName(DefaultPool)
	vol, err := l.StorageVolCreateXML(pool, volXML("bench.raw", "raw", size, ""), 0)
	if err != nil {
		b.Fatal(err)
	}
	dialRaw := func() (net.Conn, error) { return client.Dial("unix", rawSocket) }
	var upload, raw time.Duration
	b.SetBytes(2 * size)
	for b.Loop() {
		start := time.Now()
		if err := l.StorageVolUpload(vol, bytes.NewReader(data), 0, size, libvirt.StorageVolUploadFlags(0)); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := rawCopy(dialRaw, data); err != nil {
			b.Fatal(err)
		}
		upload += mid.Sub(start)
		raw += time.Since(mid)
	}
	n := float64(b.N) * size / (1 << 20)
	b.ReportMetric(n/upload.Seconds(), "upload-MiB/s")
	b.ReportMetric(n/raw.Seconds(), "raw-MiB/s")
	b.ReportMetric(raw.Seconds()/upload.Seconds(), "upload/raw")
}
