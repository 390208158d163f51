package sandbox

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// roomRuntime is a cpRuntime whose sandboxes each hold mem bytes (Stats)
// and which counts its checkpoints.
type roomRuntime struct {
	*cpRuntime
	mem         int64
	mu          sync.Mutex
	checkpoints int
}

func (r *roomRuntime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return runtime.Stats{MemoryBytes: r.mem}, nil
}

func (r *roomRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	r.mu.Lock()
	r.checkpoints++
	r.mu.Unlock()
	return r.cpRuntime.Checkpoint(ctx, id, dir)
}

func (r *roomRuntime) made() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checkpoints
}

// diskRoom is a disk whose free space a test sets.
type diskRoom struct {
	mu   sync.Mutex
	free int64
	dirs []string
}

func (d *diskRoom) set(free int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.free = free
}

func (d *diskRoom) Free(dir string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dirs = append(d.dirs, dir)
	return d.free, nil
}

// newRoomFixture is a pauseFixture whose sandboxes hold 200 MiB each on a
// disk with free bytes free.
func newRoomFixture(t *testing.T, free int64) (*pauseFixture, *roomRuntime, *diskRoom) {
	t.Helper()
	rt := &roomRuntime{cpRuntime: newCPRuntime(), mem: 200 << 20}
	disk := &diskRoom{free: free}
	f := newPauseFixture(t, rt)
	f.m.Close()
	f.cfg.DiskFree = disk.Free
	f.start(t)
	return f, rt, disk
}

// roomNeed is what a sandbox of newRoomFixture claims: its 200 MiB, an
// eighth more, and imageSlack.
const roomNeed = 200<<20 + 25<<20 + imageSlack

// TestPauseNoImageRoom: a memory pause whose image would not fit on the
// checkpoint directory's disk is refused before anything is touched
// (resource_exhausted, naming the sizes): the sandbox runs on, no
// checkpoint is begun, none is left. With room it pauses with its memory.
func TestPauseNoImageRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rt, disk := newRoomFixture(t, roomNeed-1)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.m.Pause(ctx, sb.ID)
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !errors.Is(err, errNoImageRoom) ||
			!strings.Contains(err.Error(), "needs about 289 MiB") || !strings.Contains(err.Error(), f.cfg.CheckpointDir+" has 288 MiB free") {
			t.Fatalf("Pause without room = %v; want resource_exhausted naming 289 MiB needed and 288 MiB free", err)
		}
		got, _ := f.m.Get(ctx, sb.ID)
		if State(got.State) != StateReady || got.Remaining != 0 || f.status(sb.ID) != runtime.StatusRunning || !f.attached(sb.ID) {
			t.Fatalf("after the refusal: %+v (runtime %s); want ready, running, attached", got.Sandbox, f.status(sb.ID))
		}
		if rt.made() != 0 {
			t.Errorf("a checkpoint was begun (%d)", rt.made())
		}
		if ents, _ := os.ReadDir(f.cfg.CheckpointDir); len(ents) != 0 {
			t.Errorf("checkpoint dir holds %d entries after a refusal", len(ents))
		}
		if got, want := f.st.types(sb.ID), []string{EventCreated, EventReady}; !slices.Equal(got, want) {
			t.Errorf("events %v, want %v", got, want)
		}
		disk.set(roomNeed)
		p, err := f.m.Pause(ctx, sb.ID)
		if err != nil || p.Pause != core.PauseMemory {
			t.Fatalf("Pause with room = %+v, %v; want a memory pause", p.Sandbox, err)
		}
		if len(disk.dirs) == 0 || disk.dirs[len(disk.dirs)-1] != f.cfg.CheckpointDir {
			t.Errorf("free space asked of %v, want %s", disk.dirs, f.cfg.CheckpointDir)
		}
	})
}

// TestPauseImageRoomOnTheDisk: the room is asked of the real disk
// (statfs) where no checkpoint directory exists yet, as on a daemon's
// first pause.
func TestPauseImageRoomOnTheDisk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &roomRuntime{cpRuntime: newCPRuntime(), mem: 200 << 20}
		f := newPauseFixture(t, rt)
		if _, err := os.Stat(f.cfg.CheckpointDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("checkpoint dir before the first pause: %v; want none", err)
		}
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := f.m.Pause(ctx, sb.ID); err != nil || p.Pause != core.PauseMemory {
			t.Fatalf("first pause = %+v, %v; want a memory pause", p.Sandbox, err)
		}
	})
}

// TestPauseImageRoomClaimed: the room of an image being written counts
// against the next one until it is done: with room for one image, a
// second pause while the first checkpoints is refused, and succeeds once
// the first is done.
func TestPauseImageRoomClaimed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rt, _ := newRoomFixture(t, roomNeed+roomNeed/2)
		ctx := t.Context()
		a, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		b, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		rt.onCheckpoint = func() { <-gate }
		first := make(chan error, 1)
		go func() {
			_, err := f.m.Pause(ctx, a.ID)
			first <- err
		}()
		synctest.Wait() // a's checkpoint is under way, holding its claim
		_, err = f.m.Pause(ctx, b.ID)
		if !errors.Is(err, errNoImageRoom) || !strings.Contains(err.Error(), "289 MiB more are claimed") {
			t.Fatalf("Pause while another image is written = %v; want no room, naming the 289 MiB claimed", err)
		}
		close(gate)
		if err := <-first; err != nil {
			t.Fatalf("first pause: %v", err)
		}
		rt.onCheckpoint = nil
		if p, err := f.m.Pause(ctx, b.ID); err != nil || p.Pause != core.PauseMemory {
			t.Fatalf("Pause once the first is written = %+v, %v; want a memory pause", p.Sandbox, err)
		}
	})
}

// TestDeadlinePauseNoImageRoom: a sandbox paused at its deadline whose
// memory has no room keeps its disk (a filesystem pause, its event saying
// why) instead of being destroyed.
func TestDeadlinePauseNoImageRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rt, _ := newRoomFixture(t, 1<<20)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Minute, OnTimeout: core.OnTimeoutPause})
		if err != nil {
			t.Fatal(err)
		}
		// synctest's fake clock: the sleep moves it past the deadline at
		// once, and synctest.Wait waits for the pause it sets off.
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		got, _ := f.m.Get(ctx, sb.ID)
		if State(got.State) != StatePaused || got.Pause != core.PauseFilesystem || rt.made() != 0 {
			t.Fatalf("past the deadline without room: %+v (%d checkpoints); want a filesystem pause, no checkpoint", got.Sandbox, rt.made())
		}
		evs, _ := f.st.Events(ctx, sb.ID, 0)
		last := evs[len(evs)-1]
		if last.Type != EventPaused || !strings.Contains(last.Message, "memory image needs about") {
			t.Errorf("last event %+v; want paused, saying the memory had no room", last)
		}
	})
}

// TestIdlePauseNoImageRoom: an idle pause without room leaves the sandbox
// running, says so once (pause_failed), and is tried again only after as
// long idle again, then pauses with its memory once there is room.
func TestIdlePauseNoImageRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _, disk := newRoomFixture(t, 1<<20)
		ctx := t.Context()
		sb, err := f.m.Create(ctx, CreateRequest{Timeout: time.Hour, IdlePause: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// synctest's fake clock, as above: past one idle minute, then
		// the monitor's refused pause is waited for.
		time.Sleep(time.Minute + 30*time.Second)
		synctest.Wait()
		if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StateReady {
			t.Fatalf("idle without room: %s, want ready", got.State)
		}
		failed := func() int {
			n := 0
			for _, typ := range f.st.types(sb.ID) {
				if typ == EventPauseFailed {
					n++
				}
			}
			return n
		}
		if n := failed(); n != 1 {
			t.Fatalf("%d pause_failed events after one idle period, want 1", n)
		}
		disk.set(1 << 40)
		// Another idle minute on the fake clock.
		time.Sleep(time.Minute)
		synctest.Wait()
		got, _ := f.m.Get(ctx, sb.ID)
		if State(got.State) != StatePaused || got.Pause != core.PauseMemory {
			t.Fatalf("idle again with room: %+v; want paused with its memory", got.Sandbox)
		}
		if n := failed(); n != 1 {
			t.Errorf("%d pause_failed events, want still 1", n)
		}
	})
}
