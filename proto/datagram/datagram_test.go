package datagram

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestRoundTrip: datagrams keep their bounds, empty ones included; a
// short buffer cuts one and the next is whole.
func TestRoundTrip(t *testing.T) {
	var stream bytes.Buffer
	in := [][]byte{[]byte("hello"), {}, bytes.Repeat([]byte{7}, MaxSize), []byte("after")}
	for _, d := range in {
		if err := Write(&stream, d); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, MaxSize)
	for i, d := range in[:3] {
		n, err := Read(&stream, buf)
		if err != nil || !bytes.Equal(buf[:n], d) {
			t.Fatalf("datagram %d: %d bytes, %v", i, n, err)
		}
	}
	small := make([]byte, 2)
	if n, err := Read(&stream, small); n != 2 || err != nil || string(small) != "af" {
		t.Fatalf("cut datagram = %q, %v", small[:n], err)
	}
	if _, err := Read(&stream, buf); err != io.EOF {
		t.Fatalf("end = %v, want io.EOF", err)
	}
	if err := Write(&stream, make([]byte, MaxSize+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("write over MaxSize = %v", err)
	}
}

// TestBadFrames: a frame cut short is io.ErrUnexpectedEOF, a length over
// MaxSize ErrTooLarge.
func TestBadFrames(t *testing.T) {
	buf := make([]byte, 16)
	for _, tc := range []struct {
		in   []byte
		want error
	}{
		{[]byte{0}, io.ErrUnexpectedEOF},
		{[]byte{0, 5, 'a'}, io.ErrUnexpectedEOF},
		{[]byte{0, 40, 'a'}, io.ErrUnexpectedEOF},
		{[]byte{0xff, 0xff}, ErrTooLarge},
	} {
		if _, err := Read(bytes.NewReader(tc.in), buf); !errors.Is(err, tc.want) {
			t.Errorf("Read(%v) = %v, want %v", tc.in, err, tc.want)
		}
	}
}

// FuzzRead: any stream reads as frames or an error, never more than the
// buffer, and what Write framed reads back the same.
func FuzzRead(f *testing.F) {
	f.Add([]byte{0, 3, 'a', 'b', 'c', 0, 0})
	f.Add([]byte{0xff, 0xe3})
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		buf := make([]byte, 8)
		for {
			n, err := Read(r, buf)
			if err != nil {
				break
			}
			if n > len(buf) {
				t.Fatalf("read %d into %d", n, len(buf))
			}
		}
		if len(stream) <= MaxSize {
			var w bytes.Buffer
			if err := Write(&w, stream); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(stream))
			if n, err := Read(&w, got); err != nil || n != len(stream) || !bytes.Equal(got, stream) {
				t.Fatalf("round trip of %d bytes: %d, %v", len(stream), n, err)
			}
		}
	})
}
