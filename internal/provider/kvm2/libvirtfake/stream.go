package libvirtfake

import (
	"errors"
	"io"

	"github.com/digitalocean/go-libvirt"
)

// chunkSize is how much a transfer moves at a time: libvirt's legacy stream
// payload size.
const chunkSize = 256 << 10

// Upload records one StorageVolUpload as the daemon saw it.
type Upload struct {
	Pool, Volume string
	// Offset and Length are the arguments of the call; Length 0 means "to
	// the end of the stream".
	Offset, Length uint64
	// Received is the number of bytes that arrived and were written.
	Received uint64
	// Done is set once the stream has ended, cleanly or not; Err is then
	// the error the upload ended with, nil for a clean finish.
	Done bool
	Err  error
}

// errClientAbort is how an upload the client aborted is recorded, in the
// words libvirtd logs it with. The daemon does not send it: it confirms the
// abort like a finish.
var errClientAbort = libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "stream aborted at client request"}

// transfer is one upload or download in progress: the volume is in use
// until finish.
type transfer struct {
	f      *Fake
	p      *pool
	v      *volume
	rec    int // index into f.uploads, -1 for downloads
	offset uint64
	length uint64
	done   uint64
}

func (f *Fake) beginTransfer(h libvirt.StorageVol, offset, length uint64, upload bool) (*transfer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, v, err := f.volByHandle(h)
	if err != nil {
		return nil, err
	}
	v.inUse++
	t := &transfer{f: f, p: p, v: v, rec: -1, offset: offset, length: length}
	if upload {
		t.rec = len(f.uploads)
		f.uploads = append(f.uploads, Upload{Pool: p.name, Volume: v.name, Offset: offset, Length: length})
		// Reserve the declared range once, so a large upload is not dominated by
		// the fake re-growing its buffer (benchmarks compare against a raw copy).
		if want := offset + length; length > 0 && uint64(cap(v.content)) < want {
			grown := make([]byte, len(v.content), want)
			copy(grown, v.content)
			v.content = grown
		}
	}
	return t, nil
}

// write stores one chunk of an upload at the current position. Writing past
// the declared length, or growing the file beyond the pool's free space,
// fails as the daemon's file stream does.
func (t *transfer) write(b []byte) error {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.length > 0 && t.done+uint64(len(b)) > t.length {
		return systemError("No space left on device", "cannot write to stream")
	}
	pos := t.offset + t.done
	end := pos + uint64(len(b))
	if end > t.v.allocation {
		if end-t.v.allocation > t.p.available() {
			return systemError("No space left on device", "unable to write %s", t.p.volPath(t.v.name))
		}
		t.v.allocation = end
	}
	if n := uint64(len(t.v.content)); end > n {
		if end <= uint64(cap(t.v.content)) {
			t.v.content = t.v.content[:end]
			if pos > n {
				clear(t.v.content[n:pos]) // a gap before pos reads as zeros, as in a sparse file
			}
		} else {
			// append grows the backing array geometrically, so a long upload
			// costs linear time.
			t.v.content = append(t.v.content, make([]byte, end-n)...)
		}
	}
	copy(t.v.content[pos:end], b)
	t.done += uint64(len(b))
	f.uploads[t.rec].Received = t.done
	return nil
}

// read returns the next chunk of a download, or io.EOF once the requested
// range or the file has been read. Bytes beyond what was ever written read
// as zeros, as in a sparse file.
func (t *transfer) read() ([]byte, error) {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	size := t.v.size()
	pos := t.offset + t.done
	end := size
	if t.length > 0 && t.offset+t.length < end {
		end = t.offset + t.length
	}
	if pos >= end {
		return nil, io.EOF
	}
	if end-pos > chunkSize {
		end = pos + chunkSize
	}
	out := make([]byte, end-pos)
	if pos < uint64(len(t.v.content)) {
		copy(out, t.v.content[pos:min(end, uint64(len(t.v.content)))])
	}
	t.done += end - pos
	return out, nil
}

func (t *transfer) finish(err error) {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	t.v.inUse--
	if t.rec >= 0 {
		f.uploads[t.rec].Done = true
		f.uploads[t.rec].Err = err
	}
}

// size is the volume's file size: a raw file is created at its full
// capacity (sparse), other formats grow with what is written.
func (v *volume) size() uint64 {
	n := uint64(len(v.content))
	if v.format == "raw" && v.capacity > n {
		n = v.capacity
	}
	return n
}

// StorageVolUpload implements the backend method: it writes what r yields at
// offset, at most length bytes (0: all of it). A short stream is accepted, as
// libvirt accepts it. A read error from r aborts the stream, which the
// daemon confirms like a finish, so the call returns r's own error, as
// go-libvirt's does against libvirtd. The upload is recorded (see Uploads).
func (f *Fake) StorageVolUpload(h libvirt.StorageVol, r io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error {
	const m = "StorageVolUpload"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	t, err := f.beginTransfer(h, offset, length, true)
	if err != nil {
		return err
	}
	readErr, err := t.copyFrom(r)
	if readErr != nil {
		t.finish(errClientAbort)
		return readErr
	}
	t.finish(err)
	return err
}

// copyFrom feeds r into the upload until EOF. A read error from r ends it
// as readErr, a failure to store the data as err.
func (t *transfer) copyFrom(r io.Reader) (readErr, err error) {
	buf := make([]byte, chunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := t.write(buf[:n]); err != nil {
				return nil, err
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil, nil
		}
		if rerr != nil {
			return rerr, nil
		}
	}
}

// StorageVolDownload implements the backend method: it writes the volume's
// bytes from offset, at most length of them (0: to the end of the file), to
// w. A write error from w ends the download with that error.
func (f *Fake) StorageVolDownload(h libvirt.StorageVol, w io.Writer, offset, length uint64, flags libvirt.StorageVolDownloadFlags) error {
	const m = "StorageVolDownload"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	t, err := f.beginTransfer(h, offset, length, false)
	if err != nil {
		return err
	}
	err = t.copyTo(w)
	t.finish(err)
	return err
}

func (t *transfer) copyTo(w io.Writer) error {
	for {
		b, err := t.read()
		if err != nil {
			return nil
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
}
