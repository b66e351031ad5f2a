package libvirtfake

import (
	"io"
	"sync"

	"github.com/digitalocean/go-libvirt"
)

// errConnGone ends a transfer whose client connection went away; libvirtd
// aborts such a stream with nobody left to tell.
var errConnGone = libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "client connection closed"}

type streamPacket struct {
	status uint32
	data   []byte
}

// inStream turns the stream packets of one upload into an io.Reader: data
// packets are read in order, the client's finish packet (status OK) is EOF
// and its abort packet (status error) is errClientAbort.
type inStream struct {
	ch       chan streamPacket
	done     chan struct{} // closed by stop: nobody reads any more
	gone     <-chan struct{}
	stopOnce sync.Once
	cur      []byte
	err      error
}

func newInStream(gone <-chan struct{}) *inStream {
	// A few packets of slack, then the connection's reader waits, as
	// libvirtd stops reading a client whose stream queue is full.
	return &inStream{ch: make(chan streamPacket, 8), done: make(chan struct{}), gone: gone}
}

func (s *inStream) push(p streamPacket) {
	select {
	case s.ch <- p:
	case <-s.done:
	}
}

func (s *inStream) stop() { s.stopOnce.Do(func() { close(s.done) }) }

func (s *inStream) Read(b []byte) (int, error) {
	for len(s.cur) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		var p streamPacket
		select {
		case p = <-s.ch:
		default:
			select {
			case p = <-s.ch:
			case <-s.gone:
				s.err = errConnGone
				continue
			}
		}
		switch p.status {
		case statusContinue:
			s.cur = p.data
		case statusOK:
			s.err = io.EOF
		default:
			s.err = errClientAbort
		}
	}
	n := copy(b, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}

// upload answers a StorageVolUpload: the call's reply once the volume is
// found, then the data, then a stream packet confirming the finish or
// carrying the error that ended the upload.
func (sc *serverConn) upload(h header, payload []byte, in *inStream) {
	const m = "StorageVolUpload"
	var a libvirt.StorageVolUploadArgs
	if err := decodeArgs(payload, &a); err != nil {
		_ = sc.replyError(h, err)
		return
	}
	f := sc.f
	if err := f.enter(m); err != nil {
		_ = sc.replyError(h, err)
		return
	}
	t, err := f.beginTransfer(a.Vol, a.Offset, a.Length, true)
	if err != nil {
		f.leave(m)
		_ = sc.replyError(h, err)
		return
	}
	if err := sc.replyOK(h, nil); err != nil {
		t.finish(errConnGone)
		f.leave(m)
		return
	}
	readErr, err := t.copyFrom(in)
	if readErr != nil {
		err = readErr // errClientAbort or errConnGone, from inStream
	}
	t.finish(err)
	f.leave(m)
	h.Type = typeStream
	switch err {
	case nil, errClientAbort:
		// A finish, and an abort too, get a zero-length confirmation.
		h.Status = statusOK
		_ = sc.send(h, nil)
	case errConnGone:
	default:
		// An error ends the stream as a stream packet carrying it.
		h.Status = statusError
		_ = sc.send(h, encodeError(err))
	}
}

// download answers a StorageVolDownload: the call's reply, the data in
// stream packets, and an empty data packet marking the end, as libvirtd
// sends it; with SendStreamBeforeReply the reply comes last. A client that then sends its own finish gets no confirmation:
// go-libvirt sends none.
func (sc *serverConn) download(h header, payload []byte) {
	const m = "StorageVolDownload"
	var a libvirt.StorageVolDownloadArgs
	if err := decodeArgs(payload, &a); err != nil {
		_ = sc.replyError(h, err)
		return
	}
	f := sc.f
	if err := f.enter(m); err != nil {
		_ = sc.replyError(h, err)
		return
	}
	t, err := f.beginTransfer(a.Vol, a.Offset, a.Length, false)
	if err != nil {
		f.leave(m)
		_ = sc.replyError(h, err)
		return
	}
	early := f.srv.streamFirst.Load()
	if !early {
		err = sc.replyOK(h, nil)
	}
	sh := h
	sh.Type, sh.Status = typeStream, statusContinue
	for err == nil {
		var b []byte
		if b, err = t.read(); err == nil {
			err = sc.send(sh, b)
		}
	}
	t.finish(nil)
	f.leave(m)
	if err == io.EOF {
		// libvirtd marks the end of the data with an empty data packet.
		if err = sc.send(sh, []byte{}); err == nil && early {
			_ = sc.replyOK(h, nil)
		}
	}
}
