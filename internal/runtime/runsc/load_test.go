package runsc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runtimetest"
	th "github.com/berth-sandbox/berth/test/harness"
)

// TestLoadFailsAfterRestore: a sandbox restored in the background (runsc
// restore --background) whose memory load fails after Restore returned.
// The checkpoint is served through FUSE, and every read of its pages file
// past the file's first half is held until the test lets it fail (EIO):
// Restore returns while those reads wait, the sandbox runs, WaitRestored
// waits; once they fail, WaitRestored fails (with the sentry's "async
// MemoryFile loading failed: I/O error" when its runsc reached the sentry
// before the sentry ended the sandbox, else with runsc's failure to ask),
// the sandbox's processes are gone, and Destroy leaves nothing. (runsc
// opens the image as root; the sentry reads it from its own user
// namespace, which a FUSE mount admits only with allow_other.)
func TestLoadFailsAfterRestore(t *testing.T) {
	h := newHarness(t)
	bin, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	if help, _ := exec.Command(bin, "help", "restore").CombinedOutput(); !bytes.Contains(help, []byte("-background")) {
		t.Skip("this runsc restores everything before it returns (no restore --background)")
	}
	inst := h.New(t)
	pl, ok := inst.Backend.(runtimetest.PageLoader)
	if !ok {
		t.Fatal("runsc runtime cannot wait for a load")
	}
	ctx := t.Context()
	id, spec, image := checkpointed(t, h, inst)
	cp := inst.Backend.(runtimetest.Checkpointer)
	const pages = "pages.img"
	fi, err := os.Stat(filepath.Join(image, pages))
	if err != nil {
		t.Fatalf("checkpoint has no %s: %v", pages, err)
	}
	mnt := t.TempDir()
	gate := serveHeld(t, image, mnt, pages, fi.Size()/2)
	// Before the unmount, whatever the test leaves (the sentry holds
	// the image's files open until its load ends or it is gone).
	t.Cleanup(func() { inst.Backend.Destroy(context.Background(), id) })
	t.Logf("%s: %d bytes; reads past %d held", pages, fi.Size(), fi.Size()/2)

	restored := make(chan error, 1)
	go func() { restored <- cp.Restore(ctx, spec, mnt) }()
	select {
	case err := <-restored:
		if err != nil {
			t.Fatalf("Restore with the pages' second half held = %v", err)
		}
	case <-time.After(2 * time.Minute):
		gate.release()
		t.Fatalf("Restore did not return while the pages' second half was held (held reads: %v)", gate.wasHeld())
	}
	if s, err := inst.Backend.Inspect(ctx, id); err != nil || s.Status != runtime.StatusRunning {
		t.Fatalf("Inspect after Restore = %+v, %v; want running", s, err)
	}
	// The load reaches the held half (bounded by a generous limit),
	// then those reads fail.
	select {
	case <-gate.held:
	case <-time.After(2 * time.Minute):
		t.Fatal("no read of the pages' second half came after Restore")
	}
	loaded := make(chan error, 1)
	go func() { loaded <- pl.WaitRestored(ctx, id) }()
	select {
	case err := <-loaded:
		t.Fatalf("WaitRestored = %v before the held reads ended; want it to wait for the load", err)
	default:
	}
	gate.release()
	if err := <-loaded; err == nil {
		t.Fatal("WaitRestored after reads of the pages failed = nil; want the load's failure")
	} else {
		t.Logf("WaitRestored = %v", err)
	}
	th.WaitFor(t, 60*time.Second, "the sandbox to stop after its memory load failed", func() bool {
		s, err := inst.Backend.Inspect(ctx, id)
		return err != nil || s.Status != runtime.StatusRunning
	})
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertNoLeaks(t, inst.Footprint, id)
}

// holdGate holds reads until release; held closes at the first one held.
type holdGate struct {
	held, released        chan struct{}
	heldOnce, releaseOnce sync.Once
}

func (g *holdGate) hold() { g.heldOnce.Do(func() { close(g.held) }) }

func (g *holdGate) release() { g.releaseOnce.Do(func() { close(g.released) }) }

func (g *holdGate) wasHeld() bool {
	select {
	case <-g.held:
		return true
	default:
		return false
	}
}

// heldFile is a read-only file of a served directory; reads reaching
// past hold (when hold ≥ 0) wait for the gate, then fail with EIO.
type heldFile struct {
	fs.Inode
	name string
	f    *os.File
	size int64
	hold int64
	gate *holdGate
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
	if n.hold >= 0 && off+int64(len(dest)) > n.hold && off < n.size {
		n.gate.hold()
		// Only the gate ends a held read. ctx ends when the kernel
		// passes on a signal to the reading thread (FUSE_INTERRUPT),
		// which the sentry's Go runtime sends its own threads; EINTR
		// then would fail the load before the test lets it.
		<-n.gate.released
		return nil, syscall.EIO
	}
	k, err := n.f.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:k]), 0
}

// serveHeld mounts at mnt, through FUSE, a read-only copy of the regular
// files of dir, whose file named held answers reads past its offset from
// only once the returned gate is released, with EIO. Unmounted when the
// test ends, after the cleanups registered later: a caller whose sandbox
// reads the files registers its Destroy after this.
func serveHeld(t *testing.T, dir, mnt, held string, from int64) *holdGate {
	t.Helper()
	gate := &holdGate{held: make(chan struct{}), released: make(chan struct{})}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*heldFile
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		n := &heldFile{name: e.Name(), f: f, size: fi.Size(), hold: -1, gate: gate}
		if e.Name() == held {
			n.hold = from
		}
		files = append(files, n)
	}
	root := &fs.Inode{}
	server, err := fs.Mount(mnt, root, &fs.Options{
		MountOptions: fuse.MountOptions{AllowOther: true, DirectMountStrict: true, FsName: "berth-held-image", Name: "berthtest"},
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
		gate.release()
		if err := server.Unmount(); err != nil {
			t.Errorf("FUSE unmount of %s: %v", mnt, err)
		}
	})
	return gate
}
