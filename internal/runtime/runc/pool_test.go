package runc

import (
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/diskimg"
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
	if _, ok := p.take(size, dst); ok {
		t.Fatal("take from an empty pool succeeded")
	}
	p.warm(size)
	harness.WaitFor(t, 30*time.Second, "the pool to hold 2 images", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready[size]) == 2
	})
	dev, ok := p.take(size, dst)
	if !ok {
		t.Fatal("take from a full pool failed")
	}
	// Taken with its loop device, which followed the image's rename.
	if dev == nil {
		t.Fatal("a pooled image came without its loop device")
	}
	if devs := diskimg.LoopsBacking(dst); !slices.Contains(devs, dev.Name()) {
		t.Errorf("devices backed by the taken image = %v, want %s", devs, dev.Name())
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	err = diskimg.MountLoop(dev, mnt, diskimg.Scratch)
	dev.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := diskimg.UnmountOne(t.Context(), mnt); err != nil {
		t.Fatal(err)
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
	if held := loopsUnder(filepath.Join(dir, "pool")); len(held) != 1 {
		t.Errorf("loop devices the pool holds = %v, want the spare's one", held)
	}
	p.close()
	if _, err := os.Stat(filepath.Join(dir, "pool")); !os.IsNotExist(err) {
		t.Errorf("pool dir after close: %v, want gone", err)
	}
	// The devices clear themselves once closed (the kernel may do it a
	// moment later, from a work queue): none is left on the images.
	harness.WaitFor(t, 30*time.Second, "no loop device left on the pool's or the taken image", func() bool {
		return len(loopsUnder(dir)) == 0
	})
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir+"/") {
			out = append(out, f)
		}
	}
	return out
}
