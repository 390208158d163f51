package main

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// sparseBlock is the granularity at which zeros become holes.
const sparseBlock = 4096

// sparseWriter writes to f, seeking over whole blocks of zeros instead of
// writing them, so they stay holes; finish sets the final size. Blocks
// are aligned to the file offset, whatever size the writes come in.
type sparseWriter struct {
	f   *os.File
	off int64 // logical offset: bytes accepted so far
	buf []byte
	// budget, when set, is how many bytes of data (holes are free) may
	// still be written, shared by every file of one copy.
	budget *int64
}

// errBudget is a download that carried more data than the sandbox can
// hold: a subverted agent, not a file.
var errBudget = errors.New("more data than the sandbox's disk and memory can hold")

func (s *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// Fill the current block; flush it when full.
		room := sparseBlock - len(s.buf)
		if len(s.buf) == 0 && len(p) >= sparseBlock {
			if err := s.block(p[:sparseBlock]); err != nil {
				return n - len(p), err
			}
			p = p[sparseBlock:]
			continue
		}
		k := min(room, len(p))
		s.buf = append(s.buf, p[:k]...)
		p = p[k:]
		if len(s.buf) == sparseBlock {
			if err := s.block(s.buf); err != nil {
				return n - len(p), err
			}
			s.buf = s.buf[:0]
		}
	}
	return n, nil
}

// block writes one full block at s.off, or skips it if it is all zeros.
func (s *sparseWriter) block(b []byte) error {
	if !allZero(b) {
		if err := s.spend(len(b)); err != nil {
			return err
		}
		if _, err := s.f.WriteAt(b, s.off); err != nil {
			return err
		}
	}
	s.off += int64(len(b))
	return nil
}

// finish writes the partial last block and sets the file's size (a
// trailing hole leaves it short otherwise).
func (s *sparseWriter) finish() error {
	if len(s.buf) > 0 {
		if err := s.spend(len(s.buf)); err != nil {
			return err
		}
		if _, err := s.f.WriteAt(s.buf, s.off); err != nil {
			return err
		}
		s.off += int64(len(s.buf))
		s.buf = s.buf[:0]
	}
	if err := s.f.Truncate(s.off); err != nil {
		return err
	}
	_, err := s.f.Seek(s.off, io.SeekStart)
	return err
}

func (s *sparseWriter) spend(n int) error {
	if s.budget == nil {
		return nil
	}
	if *s.budget < int64(n) {
		return errBudget
	}
	*s.budget -= int64(n)
	return nil
}

var zeroBlock [sparseBlock]byte

func allZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }
