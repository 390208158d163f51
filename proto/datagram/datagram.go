// Package datagram frames datagrams on a byte stream, as Berth's UDP port
// tunnels carry them (GET /v1/sandboxes/{id}/tunnel/{port} upgraded to
// "udp"): each datagram is its length as two bytes, big-endian, then its
// bytes, both ways. A stream keeps the datagrams' bounds and order; like
// UDP it does not say which ones the far end's socket dropped.
package datagram

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Protocol is the Upgrade token of a UDP port tunnel.
const Protocol = "udp"

// MaxSize is the largest datagram a frame holds: the largest UDP payload
// over IPv4.
const MaxSize = 65507

// ErrTooLarge is returned for a datagram over MaxSize, written or read.
var ErrTooLarge = errors.New("datagram larger than 65507 bytes")

// Write writes p to w as one frame.
func Write(w io.Writer, p []byte) error {
	if len(p) > MaxSize {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, len(p))
	}
	frame := make([]byte, 2+len(p))
	binary.BigEndian.PutUint16(frame, uint16(len(p)))
	copy(frame[2:], p)
	_, err := w.Write(frame)
	return err
}

// Read reads the next frame from r into buf and returns its length. A
// datagram longer than buf is cut to it (the rest is read and dropped, as
// a UDP socket does), and n is then len(buf). io.EOF is a clean end
// between frames; an end inside a frame is io.ErrUnexpectedEOF.
func Read(r io.Reader, buf []byte) (int, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	size := int(binary.BigEndian.Uint16(hdr[:]))
	if size > MaxSize {
		return 0, fmt.Errorf("%w: a frame says %d", ErrTooLarge, size)
	}
	n := min(size, len(buf))
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, noEOF(err)
	}
	if rest := size - n; rest > 0 {
		if _, err := io.CopyN(io.Discard, r, int64(rest)); err != nil {
			return 0, noEOF(err)
		}
	}
	return n, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Conn is a framed stream as datagrams: each Write sends one, each Read
// returns one. Reads and writes may run at once; writes are whole frames
// even from several goroutines.
type Conn struct {
	rwc io.ReadWriteCloser
	r   *bufio.Reader
	wmu sync.Mutex
}

// NewConn reads and writes datagrams on rwc.
func NewConn(rwc io.ReadWriteCloser) *Conn {
	return &Conn{rwc: rwc, r: bufio.NewReaderSize(rwc, 64<<10)}
}

// Read reads one datagram into p (cut to len(p)).
func (c *Conn) Read(p []byte) (int, error) { return Read(c.r, p) }

// Write sends p as one datagram.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := Write(c.rwc, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close closes the stream.
func (c *Conn) Close() error { return c.rwc.Close() }
