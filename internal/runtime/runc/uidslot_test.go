package runc

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestSlotsHostWide: two runtimes (two daemons) claiming from one slot dir
// concurrently never get the same range, none overlaps the canonical
// range, and each releases only its own claims.
func TestSlotsHostWide(t *testing.T) {
	claims := t.TempDir()
	type rt struct {
		s        *slots
		stateDir string
	}
	var rts []rt
	for range 2 {
		stateDir := t.TempDir()
		s, err := newSlots(claims, stateDir, 1000000, 65536)
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, rt{s, stateDir})
	}
	if base := hostBase(rts[0].s.min); base < 1000000+65536 {
		t.Fatalf("first slot starts at %d, inside the canonical range", base)
	}
	var mu sync.Mutex
	got := map[uint32]string{}
	var wg sync.WaitGroup
	for i := range 2 {
		for j := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rts[i]
				id := "sb" + string(rune('a'+i)) + string(rune('a'+j%26)) + string(rune('a'+j/26))
				dir := filepath.Join(r.stateDir, id)
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Error(err)
					return
				}
				k, err := r.s.claim(id, dir)
				if err != nil {
					t.Error(err)
					return
				}
				if back, ok := r.s.lookup(dir); !ok || back != k {
					t.Errorf("lookup(%s) = %d, %v; want %d", id, back, ok, k)
				}
				mu.Lock()
				defer mu.Unlock()
				if other, dup := got[k]; dup {
					t.Errorf("slot %d given to %s and %s", k, other, id)
				}
				got[k] = id
			}()
		}
	}
	wg.Wait()
	// Runtime 0 releases one sandbox; runtime 1's claims are untouched.
	r0 := rts[0]
	k, _ := r0.s.lookup(filepath.Join(r0.stateDir, "sbaaa"))
	if err := r0.s.release("sbaaa", k, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r0.s.claimPath(k)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim %d still there after release: %v", k, err)
	}
	if n := countClaims(t, claims); n != 99 {
		t.Errorf("%d claims left, want 99", n)
	}
	// A sandbox dir gone without a release (a crash): the next start's
	// sweep reclaims it, and only it. Without a record, release scans.
	os.RemoveAll(filepath.Join(r0.stateDir, "sbaab"))
	r0.s.releaseOrphans(func(id string) string { return filepath.Join(r0.stateDir, id) })
	if n := countClaims(t, claims); n != 98 {
		t.Errorf("%d claims left after the orphan sweep, want 98", n)
	}
	os.Remove(filepath.Join(r0.stateDir, "sbaba", slotFile))
	if err := r0.s.release("sbaba", 0, false); err != nil {
		t.Fatal(err)
	}
	if n := countClaims(t, claims); n != 97 {
		t.Errorf("%d claims left after a release without record, want 97", n)
	}
	// A daemon whose whole state dir is gone: any runtime's sweep
	// reclaims its claims.
	os.RemoveAll(rts[1].stateDir)
	r0.s.releaseOrphans(func(id string) string { return filepath.Join(r0.stateDir, id) })
	if n := countClaims(t, claims); n != 47 {
		t.Errorf("%d claims left after the other daemon's state went, want 47", n)
	}
}

func countClaims(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestSlotsBounds(t *testing.T) {
	if _, err := newSlots(t.TempDir(), "/x", 1000000, 65537); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("uid count over a slot: %v, want ErrInvalidArgument", err)
	}
	if _, err := newSlots(t.TempDir(), "/x", 1<<32-100, 10); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("uid base at the top: %v, want ErrInvalidArgument", err)
	}
	s, err := newSlots(t.TempDir(), "/x", 1<<32-3*65536, 65536)
	if err != nil {
		t.Fatal(err)
	}
	// Room for exactly one slot below uid 4294967295.
	if s.min != s.max || uint64(hostBase(s.max))+65536 > 1<<32-1 {
		t.Errorf("slots %d..%d near the top", s.min, s.max)
	}
	dir := t.TempDir()
	if _, err := s.claim("a", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.claim("b", dir); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("claim with no slot free = %v, want ErrResourceExhausted", err)
	}
}

// TestSlotsUpcoming: upcoming names the slots claim hands out next, in
// that order, skipping slots another runtime claimed.
func TestSlotsUpcoming(t *testing.T) {
	claims := t.TempDir()
	a, err := newSlots(claims, t.TempDir(), 1000000, 65536)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newSlots(claims, t.TempDir(), 1000000, 65536)
	if err != nil {
		t.Fatal(err)
	}
	next := a.upcoming(3)
	if len(next) != 3 {
		t.Fatalf("upcoming(3) = %v", next)
	}
	// Another daemon takes the first of them.
	if k, err := b.claim("other", t.TempDir()); err != nil || k != next[0] {
		t.Fatalf("other claim = %d, %v; want %d", k, err, next[0])
	}
	want := a.upcoming(2)
	if want[0] != next[1] || want[1] != next[2] {
		t.Errorf("upcoming after another's claim = %v, want %v", want, next[1:])
	}
	for _, w := range want {
		k, err := a.claim("mine", t.TempDir())
		if err != nil || k != w {
			t.Errorf("claim = %d, %v; want %d as upcoming said", k, err, w)
		}
	}
}
