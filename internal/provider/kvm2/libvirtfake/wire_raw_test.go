package libvirtfake

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/davecgh/go-xdr/xdr2"
	"github.com/digitalocean/go-libvirt"
)

// rawClient speaks the protocol by hand, for what go-libvirt never sends.
type rawClient struct {
	t      *testing.T
	conn   net.Conn
	serial int32
}

func newRawClient(t *testing.T, f *Fake) *rawClient {
	client, server := net.Pipe()
	go f.ServeConn(server)
	t.Cleanup(func() { _ = client.Close() })
	return &rawClient{t: t, conn: client}
}

// call sends one call and returns the reply's status and, for an error, the
// libvirt error it carries.
func (c *rawClient) call(program, proc uint32, args any) (uint32, libvirt.Error) {
	c.t.Helper()
	var payload bytes.Buffer
	if args != nil {
		if _, err := xdr.Marshal(&payload, args); err != nil {
			c.t.Fatal(err)
		}
	}
	c.serial++
	h := header{Program: program, Version: remoteVersion, Procedure: proc, Type: typeCall, Serial: c.serial}
	pkt := binary.BigEndian.AppendUint32(nil, uint32(4+headerSize+payload.Len()))
	for _, v := range []uint32{h.Program, h.Version, h.Procedure, h.Type, uint32(h.Serial), h.Status} {
		pkt = binary.BigEndian.AppendUint32(pkt, v)
	}
	if _, err := c.conn.Write(append(pkt, payload.Bytes()...)); err != nil {
		c.t.Fatal(err)
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(c.conn, lenBuf[:]); err != nil {
		c.t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(lenBuf[:])-4)
	if _, err := io.ReadFull(c.conn, body); err != nil {
		c.t.Fatal(err)
	}
	if serial := int32(binary.BigEndian.Uint32(body[16:])); serial != c.serial {
		c.t.Fatalf("reply serial %d, want %d", serial, c.serial)
	}
	status := binary.BigEndian.Uint32(body[20:])
	var re remoteError
	if status == statusError {
		if _, err := xdr.Unmarshal(bytes.NewReader(body[headerSize:]), &re); err != nil {
			c.t.Fatalf("decoding remote_error: %v", err)
		}
		return status, libvirt.Error{Code: uint32(re.Code), Message: re.Message[0]}
	}
	return status, libvirt.Error{}
}

func TestProtocolOpenRules(t *testing.T) {
	f := New()
	c := newRawClient(t, f)
	status, err := c.call(remoteProgram, 59, nil) // ConnectGetHostname
	if status != statusError || err != Errorf(libvirt.ErrInternalError, "connection not open") {
		t.Fatalf("call before open: %d %v", status, err)
	}
	open := struct {
		Name  libvirt.OptString
		Flags uint32
	}{Name: libvirt.OptString{string(libvirt.QEMUSystem)}}
	if status, err := c.call(remoteProgram, 1, open); status != statusOK {
		t.Fatalf("open: %v", err)
	}
	if _, err := c.call(remoteProgram, 1, open); err.Code != uint32(libvirt.ErrInternalError) {
		t.Fatalf("second open: %v", err)
	}
	if status, err := c.call(remoteProgram, 59, nil); status != statusOK {
		t.Fatalf("call after open: %v", err)
	}
	if _, err := c.call(0x11223344, 59, nil); err.Code != uint32(libvirt.ErrRPC) {
		t.Fatalf("unknown program: %v", err)
	}
	if _, err := c.call(remoteProgram, 9999, nil); err.Message != "unknown procedure: 9999" {
		t.Fatalf("unknown procedure: %v", err)
	}
	if _, err := c.call(remoteProgram, 23, nil); err.Code != uint32(libvirt.ErrRPC) { // DomainLookupByName, no args
		t.Fatalf("undecodable arguments: %v", err)
	}
}
