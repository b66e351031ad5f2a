// Package imagecache holds the parts of the kvm2 provider's image cache that stand on their
// own. SourceReader is the reader a base image is uploaded from: it counts and hashes the
// bytes on their way from the image URL into StorageVolUpload.
package imagecache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"sync"
)

const (
	// fillSize is how much SourceReader gathers before handing data on, so the stream
	// carries few large packets rather than one per network read.
	fillSize = 1 << 20
	// hashDepth is how many chunks may wait for the hasher.
	hashDepth = 3
)

// SourceReader is the reader handed to StorageVolUpload. It counts what passes and hashes
// it with sha256, and it turns any error of the source into a clean end of stream, keeping
// the error for Finish: go-libvirt answers a reader error by aborting the stream, and the
// call then reports the abort rather than the cause. The short upload that results is
// caught by the length and digest checks.
//
// The hash runs on a goroutine of its own, fed copies of the chunks, so hashing one chunk
// overlaps with sending the previous one instead of holding up the stream; at most
// hashDepth+1 chunk buffers exist at a time.
//
// go-libvirt may still be inside Read when StorageVolUpload returns (its sender outlives an
// abandoned call), so the state is guarded and Finish stops all further use of it.
type SourceReader struct {
	r io.Reader

	mu       sync.Mutex
	n        int64
	err      error
	finished bool

	chunks chan []byte // to the hasher; closed by Finish
	free   chan []byte // buffers for chunks, back from the hasher
	sum    chan string // the hasher's digest, once chunks is closed
	once   sync.Once
	digest string
}

// NewSourceReader starts the hasher of a reader over r; Finish ends it.
func NewSourceReader(r io.Reader) *SourceReader {
	s := &SourceReader{r: r, chunks: make(chan []byte, hashDepth), free: make(chan []byte, hashDepth+1),
		sum: make(chan string, 1)}
	for range hashDepth + 1 {
		s.free <- nil // allocated on first use
	}
	go s.hash()
	return s
}

func (s *SourceReader) hash() {
	h := sha256.New()
	for c := range s.chunks {
		h.Write(c)
		s.free <- c[:0]
	}
	s.sum <- hex.EncodeToString(h.Sum(nil))
}

func (s *SourceReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	stop := s.finished || s.err != nil
	s.mu.Unlock()
	if stop {
		return 0, io.EOF
	}
	n, err := fill(s.r, p[:min(len(p), fillSize)])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return 0, io.EOF
	}
	if n > 0 {
		// The hasher returns buffers without taking mu, so this wait always ends.
		s.chunks <- append(<-s.free, p[:n]...)
		s.n += int64(n)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	if n > 0 {
		return n, nil
	}
	if err == nil {
		return 0, nil
	}
	return 0, io.EOF
}

// fill reads from r until p is full or r fails or ends.
func fill(r io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := r.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Done is the number of bytes read so far.
func (s *SourceReader) Done() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Finish ends the reader and returns the bytes read, their sha256 and the source's error.
// It waits for the hasher, which then exits.
func (s *SourceReader) Finish() (int64, string, error) {
	s.mu.Lock()
	if !s.finished {
		s.finished = true
		close(s.chunks)
	}
	n, err := s.n, s.err
	s.mu.Unlock()
	s.once.Do(func() { s.digest = <-s.sum })
	return n, s.digest, err
}
