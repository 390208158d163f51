package runc

import (
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/test/harness"
)

func TestDiskPool(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed (apt-get install e2fsprogs)")
	}
	dir := t.TempDir()
	p, err := newDiskPool(filepath.Join(dir, "pool"), 2, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	dst := filepath.Join(dir, "first.img")
	if p.take(size, dst) {
		t.Fatal("take from an empty pool succeeded")
	}
	p.warm(size)
	harness.WaitFor(t, 30*time.Second, "the pool to hold 2 images", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready[size]) == 2
	})
	if !p.take(size, dst) {
		t.Fatal("take from a full pool failed")
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	magic := make([]byte, 2)
	if _, err := f.ReadAt(magic, 1024+56); err != nil || binary.LittleEndian.Uint16(magic) != 0xEF53 || fi.Size() != size {
		t.Errorf("taken image: size %d, ext magic %x (%v); want %d and ef53", fi.Size(), magic, err, size)
	}
	p.close()
	if _, err := os.Stat(filepath.Join(dir, "pool")); !os.IsNotExist(err) {
		t.Errorf("pool dir after close: %v, want gone", err)
	}
}
