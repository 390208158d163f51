package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// HoldGate holds the reads ServeHeld's held range gets until Release;
// Held closes at the first one held.
type HoldGate struct {
	held, released        chan struct{}
	heldOnce, releaseOnce sync.Once
}

// Held closes when the first read of the held range arrives.
func (g *HoldGate) Held() <-chan struct{} { return g.held }

// Release ends every held read, and any later one of the range, with EIO.
func (g *HoldGate) Release() { g.releaseOnce.Do(func() { close(g.released) }) }

// WasHeld reports whether a read of the held range has arrived.
func (g *HoldGate) WasHeld() bool {
	select {
	case <-g.held:
		return true
	default:
		return false
	}
}

func (g *HoldGate) hold() { g.heldOnce.Do(func() { close(g.held) }) }

// heldFile is a read-only file of a served directory; reads that touch
// [from, to) (when to > from) wait for the gate, then fail with EIO.
type heldFile struct {
	fs.Inode
	name     string
	f        *os.File
	size     int64
	from, to int64
	gate     *HoldGate
}

var (
	_ fs.NodeGetattrer = (*heldFile)(nil)
	_ fs.NodeOpener    = (*heldFile)(nil)
	_ fs.NodeReader    = (*heldFile)(nil)
)

func (n *heldFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(n.size)
	return 0
}

func (n *heldFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, 0, 0
}

func (n *heldFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < n.to && off+int64(len(dest)) > n.from {
		n.gate.hold()
		// Only the gate ends a held read. ctx ends when the kernel
		// passes on a signal to the reading thread (FUSE_INTERRUPT),
		// which gVisor's sentry, a Go program, sends its own threads;
		// EINTR then would fail the read before the test lets it.
		<-n.gate.released
		return nil, syscall.EIO
	}
	k, err := n.f.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:k]), 0
}

// HeldSource is the source of every mount ServeHeld makes, which tests
// that look for mounts left on the host (hostile's) tell apart from a
// sandbox's: another package's test may hold one while they run.
const HeldSource = "berth-held-image"

// ServeHeld mounts at mnt, through FUSE, a read-only copy of the regular
// files of dir, whose file named held answers reads that touch [from, to)
// only once the returned gate is released, with EIO. It is mounted with
// allow_other: gVisor's sentry reads a memory image from its own user
// namespace, which a FUSE mount admits only with it. Unmounted when the
// test ends, after the cleanups registered later: a caller whose sandbox
// reads the files registers its Destroy after this.
func ServeHeld(t TB, dir, mnt, held string, from, to int64) *HoldGate {
	t.Helper()
	gate := &HoldGate{held: make(chan struct{}), released: make(chan struct{})}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var files []*heldFile
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatalf("%v", err)
		}
		t.Cleanup(func() { f.Close() })
		fi, err := f.Stat()
		if err != nil {
			t.Fatalf("%v", err)
		}
		n := &heldFile{name: e.Name(), f: f, size: fi.Size(), gate: gate}
		if e.Name() == held {
			n.from, n.to = from, to
		}
		files = append(files, n)
	}
	root := &fs.Inode{}
	server, err := fs.Mount(mnt, root, &fs.Options{
		MountOptions: fuse.MountOptions{AllowOther: true, DirectMountStrict: true, FsName: HeldSource, Name: "berthtest"},
		OnAdd: func(ctx context.Context) {
			for i, n := range files {
				ch := root.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: uint64(i + 2)})
				root.AddChild(n.name, ch, true)
			}
		},
	})
	if err != nil {
		t.Fatalf("FUSE mount at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		gate.Release()
		if err := server.Unmount(); err != nil {
			t.Errorf("FUSE unmount of %s: %v", mnt, err)
		}
	})
	return gate
}

// heldPattern is what PatternScript fills each page of its file with:
// HeldStretch finds those pages in a memory image by it.
var heldPattern = bytes.Repeat([]byte("BBBBBBB\n"), 4096/8)

// PatternScript is a shell command that writes n bytes (a multiple of
// 4096) of heldPattern pages to the file at path and prints "held": in
// /dev/shm of a gVisor sandbox (a tmpfs, kept in the sentry's memory),
// pages that its memory image then holds and nothing reads again.
func PatternScript(path string, n int) string {
	return fmt.Sprintf("yes BBBBBBB | head -c %d > %s && echo held", n, path)
}

// HeldStretch is a stretch [from, to) of the pages file at path that
// holds only PatternScript's pages, for ServeHeld to hold: 256 KiB from
// the middle of the longest run of them, which must be 1 MiB at least.
// The sentry reads its pages file at most 256 KiB at a time, so no read
// that touches the stretch reaches pages of anything else, which the
// restore or the sandbox may need.
func HeldStretch(t TB, path string) (from, to int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer f.Close()
	page := make([]byte, len(heldPattern))
	start := int64(-1)
	for off := int64(0); ; off += int64(len(page)) {
		_, err := io.ReadFull(f, page)
		match := err == nil && bytes.Equal(page, heldPattern)
		if match && start < 0 {
			start = off
		}
		if !match && start >= 0 {
			if off-start > to-from {
				from, to = start, off
			}
			start = -1
		}
		if err != nil {
			break
		}
	}
	if to-from < 1<<20 {
		t.Fatalf("%s has %d bytes of PatternScript's pages in a row, want at least 1 MiB", path, to-from)
	}
	t.Logf("%s: %d KiB of PatternScript's pages from %d", path, (to-from)>>10, from)
	from = (from + (to-from)/2) &^ 4095
	return from, min(from+256<<10, to)
}
