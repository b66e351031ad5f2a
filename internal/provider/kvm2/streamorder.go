package kvm2

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
)

// libvirt's remote protocol framing: a 4-byte big-endian packet length that counts itself,
// then program, version, procedure, type, serial and status, 4 bytes each, then the payload.
const (
	lvRemoteProgram = 0x20008086
	lvHeaderLen     = 4 + 24
	lvMaxPacket     = 32<<20 + lvHeaderLen // VIR_NET_MESSAGE_MAX plus the header
	lvTypeCall      = 0
	lvTypeReply     = 1
	lvTypeStream    = 3
)

// Procedures whose call opens a data stream on its serial. The numbers are libvirt's
// REMOTE_PROC_STORAGE_VOL_UPLOAD and REMOTE_PROC_STORAGE_VOL_DOWNLOAD (remote_protocol.x;
// ProcStorageVolUpload and ProcStorageVolDownload in go-libvirt's internal/constants,
// which it does not export).
var lvStreamProcs = map[uint32]bool{208: true, 209: true}

// maxHeldStreamBytes bounds what streamOrderConn holds for one connection while it waits
// for the replies of stream calls.
const maxHeldStreamBytes = 8 << 20

// streamOrderConn puts a stream call's reply back in front of its stream packets.
// libvirtd may send a download's data, and its end, before the reply to the call that
// started it; go-libvirt takes the first packet on the serial for the reply, loses the
// data, and its reader then blocks for good delivering the late reply. The conn notes the
// serials of outgoing upload and download calls, holds stream packets that arrive for one
// of them before its reply, and hands the reader the reply followed by the held packets.
// Every other packet passes through unchanged and in order. Writes pass through unchanged.
type streamOrderConn struct {
	net.Conn
	limit int

	mu      sync.Mutex
	pending map[int32]bool // stream calls sent whose reply has not arrived

	wmu  sync.Mutex
	whdr [lvHeaderLen]byte
	wn   int // header bytes of the current outgoing packet seen
	skip int // payload bytes of the current outgoing packet still to pass

	rmu   sync.Mutex
	out   []byte             // packets ready for the reader
	held  map[int32][][]byte // stream packets waiting for their call's reply
	nheld int
	err   error // what ended the read side
}

func newStreamOrderConn(c net.Conn) *streamOrderConn {
	return &streamOrderConn{Conn: c, limit: maxHeldStreamBytes,
		pending: map[int32]bool{}, held: map[int32][][]byte{}}
}

// Write notes the serials of stream calls in b before passing b on unchanged, so a reply
// can never arrive for a call not yet noted.
func (s *streamOrderConn) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for rest := b; len(rest) > 0; {
		if s.skip > 0 {
			n := min(s.skip, len(rest))
			s.skip -= n
			rest = rest[n:]
			continue
		}
		n := copy(s.whdr[s.wn:], rest)
		s.wn += n
		rest = rest[n:]
		if s.wn < lvHeaderLen {
			break
		}
		s.wn = 0
		size := int(binary.BigEndian.Uint32(s.whdr[0:]))
		s.skip = max(size-lvHeaderLen, 0)
		prog, proc := binary.BigEndian.Uint32(s.whdr[4:]), binary.BigEndian.Uint32(s.whdr[12:])
		typ, serial := binary.BigEndian.Uint32(s.whdr[16:]), int32(binary.BigEndian.Uint32(s.whdr[20:]))
		if prog == lvRemoteProgram && typ == lvTypeCall && lvStreamProcs[proc] {
			s.mu.Lock()
			s.pending[serial] = true
			s.mu.Unlock()
		}
	}
	return s.Conn.Write(b)
}

// Read hands out whole packets in the order the reader must see them.
func (s *streamOrderConn) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if err := s.readPacket(); err != nil {
			s.err = err
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// readPacket reads one packet from the connection and queues it, holds it, or queues it
// after a reply together with what was held for that reply.
func (s *streamOrderConn) readPacket() error {
	var lenBuf [4]byte
	if _, err := io.ReadFull(s.Conn, lenBuf[:]); err != nil {
		return err
	}
	size := int(binary.BigEndian.Uint32(lenBuf[:]))
	if size < lvHeaderLen || size > lvMaxPacket {
		_ = s.Conn.Close()
		return fmt.Errorf("libvirt packet of %d bytes from %s: outside %d..%d", size, s.remote(), lvHeaderLen, lvMaxPacket)
	}
	pkt := make([]byte, size)
	copy(pkt, lenBuf[:])
	if _, err := io.ReadFull(s.Conn, pkt[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	typ, serial := binary.BigEndian.Uint32(pkt[16:]), int32(binary.BigEndian.Uint32(pkt[20:]))
	if binary.BigEndian.Uint32(pkt[4:]) != lvRemoteProgram || (typ != lvTypeStream && typ != lvTypeReply) {
		s.out = append(s.out, pkt...)
		return nil
	}
	s.mu.Lock()
	waiting := s.pending[serial]
	if waiting && typ == lvTypeReply {
		delete(s.pending, serial)
	}
	s.mu.Unlock()
	switch {
	case !waiting:
		s.out = append(s.out, pkt...)
	case typ == lvTypeStream:
		s.nheld += len(pkt)
		if s.nheld > s.limit {
			_ = s.Conn.Close()
			return fmt.Errorf("libvirt stream %d on %s: %d bytes arrived before the call's reply, more than the %d that may be held",
				serial, s.remote(), s.nheld, s.limit)
		}
		s.held[serial] = append(s.held[serial], pkt)
	default: // the reply, OK or error: it goes first, then what came early
		s.out = append(s.out, pkt...)
		for _, h := range s.held[serial] {
			s.out = append(s.out, h...)
			s.nheld -= len(h)
		}
		delete(s.held, serial)
	}
	return nil
}

func (s *streamOrderConn) remote() string {
	if a := s.Conn.RemoteAddr(); a != nil {
		return a.String()
	}
	return "libvirt socket"
}
