package libvirtfake

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/davecgh/go-xdr/xdr2"
	"github.com/digitalocean/go-libvirt"
)

// libvirt's remote protocol (src/rpc/virnetprotocol.x, remote_protocol.x).
const (
	remoteProgram   = 0x20008086
	remoteVersion   = 1
	headerSize      = 24
	maxPacket       = 32 << 20 // VIR_NET_MESSAGE_MAX
	typeCall        = 0
	typeReply       = 1
	typeStream      = 3
	statusOK        = 0
	statusError     = 1
	statusContinue  = 2
	errorLevelError = 2 // VIR_ERR_ERROR
)

type header struct {
	Program, Version, Procedure, Type uint32
	Serial                            int32
	Status                            uint32
}

// serverState is the part of the Fake that belongs to ServeConn.
type serverState struct {
	mu    sync.Mutex
	conns map[*serverConn]struct{}
	drops map[string]int
	// streamFirst makes downloads send their data and end before the call's reply.
	streamFirst atomic.Bool
}

// SendStreamBeforeReply makes every StorageVolDownload served from now on send its data
// packets and the empty packet that ends them before the call's reply, as libvirtd 9.0
// sometimes does, instead of the reply first.
func (f *Fake) SendStreamBeforeReply(on bool) { f.srv.streamFirst.Store(on) }

// ServeConn speaks libvirt's remote protocol on conn, as libvirtd does on its
// unix socket, until the client closes it, it breaks or KillConnections
// closes it; conn is closed when ServeConn returns. Calls run concurrently,
// each through the same methods, hooks and state as a direct call.
// StorageVolUpload and StorageVolDownload stream their data the way
// libvirtd does. Errors reach the client as libvirt errors with their code
// and message; an injected error that is not a libvirt.Error arrives as
// ErrInternalError. Calls in flight when the connection ends (a Block gate,
// say) finish on their own once released; ServeConn does not wait for them.
func (f *Fake) ServeConn(conn net.Conn) {
	sc := &serverConn{f: f, conn: conn, streams: map[int32]*inStream{}, gone: make(chan struct{})}
	f.srv.mu.Lock()
	if f.srv.conns == nil {
		f.srv.conns = map[*serverConn]struct{}{}
	}
	f.srv.conns[sc] = struct{}{}
	f.srv.mu.Unlock()
	defer func() {
		f.srv.mu.Lock()
		delete(f.srv.conns, sc)
		f.srv.mu.Unlock()
		close(sc.gone)
		_ = conn.Close()
	}()
	sc.readLoop()
}

// Dial returns one end of an in-memory pipe whose other end is served by
// ServeConn, so *Fake is a go-libvirt socket.Dialer:
// libvirt.NewWithDialer(f) connects the real client without a network.
func (f *Fake) Dial() (net.Conn, error) {
	client, server := net.Pipe()
	go f.ServeConn(server)
	return client, nil
}

// KillConnections closes every connection ServeConn is serving, abruptly:
// no reply for the calls in flight, as when libvirtd dies.
func (f *Fake) KillConnections() {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	for sc := range f.srv.conns {
		_ = sc.conn.Close()
	}
}

// Connections returns how many connections ServeConn is serving now.
func (f *Fake) Connections() int {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	return len(f.srv.conns)
}

// DropNext makes the next call of method that arrives over ServeConn close
// its connection instead of being answered: the call has no effect and the
// client sees the link die mid-call. The call is counted.
func (f *Fake) DropNext(method string) {
	checkMethod(method)
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	if f.srv.drops == nil {
		f.srv.drops = map[string]int{}
	}
	f.srv.drops[method]++
}

func (f *Fake) takeDrop(method string) bool {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	if f.srv.drops[method] == 0 {
		return false
	}
	f.srv.drops[method]--
	f.mu.Lock()
	f.calls[method]++
	f.mu.Unlock()
	return true
}

type serverConn struct {
	f      *Fake
	conn   net.Conn
	wmu    sync.Mutex
	opened atomic.Bool
	gone   chan struct{} // closed when ServeConn returns

	smu     sync.Mutex
	streams map[int32]*inStream // uploads receiving data, by serial
}

func (sc *serverConn) readLoop() {
	r := bufio.NewReaderSize(sc.conn, 64<<10)
	var lenBuf [4]byte
	for {
		if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(lenBuf[:])
		if n < 4+headerSize || n > maxPacket {
			return // libvirtd drops a client that sends a bad length
		}
		buf := make([]byte, n-4)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		h := header{
			Program:   binary.BigEndian.Uint32(buf[0:]),
			Version:   binary.BigEndian.Uint32(buf[4:]),
			Procedure: binary.BigEndian.Uint32(buf[8:]),
			Type:      binary.BigEndian.Uint32(buf[12:]),
			Serial:    int32(binary.BigEndian.Uint32(buf[16:])),
			Status:    binary.BigEndian.Uint32(buf[20:]),
		}
		sc.dispatch(h, buf[headerSize:])
	}
}

func (sc *serverConn) dispatch(h header, payload []byte) {
	switch {
	case h.Type == typeStream:
		sc.smu.Lock()
		s := sc.streams[h.Serial]
		sc.smu.Unlock()
		if s != nil {
			s.push(streamPacket{status: h.Status, data: payload})
		}
		// Packets of finished or unknown streams are dropped, as the
		// daemon drops what follows an aborted stream.
	case h.Type != typeCall:
		// Replies and messages from a client mean nothing to the daemon.
	case h.Program != remoteProgram || h.Version != remoteVersion:
		_ = sc.replyError(h, libvirt.Error{Code: uint32(libvirt.ErrRPC),
			Message: fmt.Sprintf("cannot find program %d version %d", h.Program, h.Version)})
	default:
		p, ok := procedures[h.Procedure]
		if !ok {
			_ = sc.replyError(h, libvirt.Error{Code: uint32(libvirt.ErrRPC),
				Message: fmt.Sprintf("unknown procedure: %d", h.Procedure)})
			return
		}
		if sc.f.takeDrop(p.name) {
			_ = sc.conn.Close()
			return
		}
		var in *inStream
		if p.upload {
			// Registered before the next packet is read, so no data packet
			// can arrive ahead of its stream.
			in = newInStream(sc.gone)
			sc.smu.Lock()
			sc.streams[h.Serial] = in
			sc.smu.Unlock()
		}
		go sc.call(h, p, payload, in)
	}
}

func (sc *serverConn) call(h header, p procedure, payload []byte, in *inStream) {
	if in != nil {
		defer func() {
			sc.smu.Lock()
			delete(sc.streams, h.Serial)
			sc.smu.Unlock()
			in.stop()
		}()
	}
	if p.name != "AuthList" && p.name != "ConnectOpen" && !sc.opened.Load() {
		_ = sc.replyError(h, Errorf(libvirt.ErrInternalError, "connection not open"))
		return
	}
	switch {
	case p.upload:
		sc.upload(h, payload, in)
	case p.download:
		sc.download(h, payload)
	default:
		ret, err := p.fn(sc, payload)
		if err != nil {
			_ = sc.replyError(h, err)
			return
		}
		_ = sc.replyOK(h, ret)
	}
}

func (sc *serverConn) send(h header, payload []byte) error {
	buf := make([]byte, 4+headerSize, 4+headerSize+len(payload))
	binary.BigEndian.PutUint32(buf[0:], uint32(4+headerSize+len(payload)))
	binary.BigEndian.PutUint32(buf[4:], h.Program)
	binary.BigEndian.PutUint32(buf[8:], h.Version)
	binary.BigEndian.PutUint32(buf[12:], h.Procedure)
	binary.BigEndian.PutUint32(buf[16:], h.Type)
	binary.BigEndian.PutUint32(buf[20:], uint32(h.Serial))
	binary.BigEndian.PutUint32(buf[24:], h.Status)
	buf = append(buf, payload...)
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_, err := sc.conn.Write(buf)
	return err
}

func (sc *serverConn) replyOK(h header, ret any) error {
	var payload []byte
	if ret != nil {
		var b bytes.Buffer
		if _, err := xdr.Marshal(&b, ret); err != nil {
			return sc.replyError(h, Errorf(libvirt.ErrInternalError, "encoding reply: %v", err))
		}
		payload = b.Bytes()
	}
	h.Type, h.Status = typeReply, statusOK
	return sc.send(h, payload)
}

// remoteError is libvirt's remote_error, the payload of every error reply.
type remoteError struct {
	Code    int32
	Domain  int32
	Message libvirt.OptString
	Level   int32
	Dom     libvirt.OptDomain
	Str1    libvirt.OptString
	Str2    libvirt.OptString
	Str3    libvirt.OptString
	Int1    int32
	Int2    int32
	Net     libvirt.OptNetwork
}

func encodeError(err error) []byte {
	var le libvirt.Error
	if !errors.As(err, &le) {
		le = Errorf(libvirt.ErrInternalError, "%s", err.Error())
	}
	re := remoteError{Code: int32(le.Code), Message: libvirt.OptString{le.Message}, Level: errorLevelError,
		Str1: libvirt.OptString{le.Message}}
	var b bytes.Buffer
	_, _ = xdr.Marshal(&b, re)
	return b.Bytes()
}

func (sc *serverConn) replyError(h header, err error) error {
	h.Type, h.Status = typeReply, statusError
	return sc.send(h, encodeError(err))
}

func decodeArgs(payload []byte, v any) error {
	if _, err := xdr.Unmarshal(bytes.NewReader(payload), v); err != nil {
		return libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "Unable to decode message payload"}
	}
	return nil
}
