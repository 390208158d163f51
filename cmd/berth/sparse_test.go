package main

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestSparseWriter(t *testing.T) {
	// 8 MiB of zeros with data at both ends and one byte in the middle,
	// written in odd-sized pieces.
	want := make([]byte, 8<<20+123)
	copy(want, "head")
	want[4<<20+7] = 1
	copy(want[len(want)-4:], "tail")
	for _, tail := range []int{0, 4} {
		data := want[:len(want)-tail]
		p := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		sw := &sparseWriter{f: f}
		rng := rand.New(rand.NewPCG(1, 2))
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(70000))
			if _, err := sw.Write(rest[:n]); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
		}
		if err := sw.finish(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("sparse copy differs (len %d, want %d)", len(got), len(data))
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if used := st.Blocks * 512; used > 1<<20 {
			t.Errorf("sparse copy of %d bytes (3 data blocks) uses %d bytes on disk", len(data), used)
		}
	}
}

func TestSparseWriterBudget(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	budget := int64(3 * sparseBlock)
	sw := &sparseWriter{f: f, budget: &budget}
	// Holes are free; data past the budget is refused.
	if _, err := sw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("zeros: %v", err)
	}
	data := bytes.Repeat([]byte{7}, 4*sparseBlock)
	if _, err := sw.Write(data); !errors.Is(err, errBudget) {
		t.Errorf("writing 4 blocks with a budget of 3: %v, want errBudget", err)
	}
}
