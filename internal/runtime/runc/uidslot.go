package runc

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

// Every sandbox gets its own host uid/gid range, a "slot": slot k is host
// ids k*slotSize .. k*slotSize+slotSize-1, and the sandbox's ids
// 0..UIDCount-1 map onto its start. Distinct ranges mean that nothing the
// kernel accounts or authorizes by host uid (key quotas, RLIMIT_NPROC on
// old kernels, signals, file ownership, inotify limits) is shared between
// sandboxes.
//
// Slots are handed out host-wide, since several daemons (separate data
// dirs and instances) may run side by side: a slot is claimed by creating
// SlotDir/<k> with O_EXCL, which is atomic across processes. The claim file
// names its owner (state dir and sandbox id), so a daemon can find and
// reclaim its own claims after a crash; the sandbox's state directory
// records its slot too (uid-slot), so a restarted daemon re-adopts the
// sandbox with the same range. Slots are numbered on a global grid (not
// relative to UIDBase) so daemons configured with different bases still
// agree on what a claim covers.
//
// The canonical range UIDBase..UIDBase+UIDCount-1 owns the template layers
// on disk and is never a slot: sandboxes see the layers through idmapped
// mounts (idmap.go) that map canonical ids onto their slot.

// slotSize is the width of one slot, the largest uid_count allowed.
const slotSize = 65536

// defaultSlotDir is where slot claims live: tmpfs, host-wide, gone at
// reboot together with every sandbox that held one.
const defaultSlotDir = "/run/berth/uid-slots"

// slotFile is the file in a sandbox's state dir that records its slot.
const slotFile = "uid-slot"

// slots allocates slots for one Runtime.
type slots struct {
	dir      string // SlotDir
	stateDir string // the owner recorded in this runtime's claims
	min, max uint32 // usable slot numbers, inclusive
	next     atomic.Uint32
}

func newSlots(dir, stateDir string, uidBase, uidCount uint32) (*slots, error) {
	if uidCount > slotSize {
		return nil, fmt.Errorf("uid count %d exceeds %d: %w", uidCount, slotSize, errdefs.ErrInvalidArgument)
	}
	// First slot entirely above the canonical range; the last one must
	// stay clear of uid 4294967295, which means "no uid" to the kernel.
	end := uint64(uidBase) + uint64(uidCount)
	minSlot := (end + slotSize - 1) / slotSize
	maxSlot := (uint64(math.MaxUint32) - slotSize) / slotSize
	if minSlot > maxSlot {
		return nil, fmt.Errorf("uid base %d leaves no room for sandbox uid ranges: %w", uidBase, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("slot dir: %w", err)
	}
	s := &slots{dir: dir, stateDir: stateDir, min: uint32(minSlot), max: uint32(maxSlot)}
	s.next.Store(s.min)
	return s, nil
}

// hostBase is the first host id of slot k.
func hostBase(k uint32) uint32 { return k * slotSize }

func (s *slots) claimPath(k uint32) string {
	return filepath.Join(s.dir, strconv.FormatUint(uint64(k), 10))
}

func (s *slots) owner(id string) string { return s.stateDir + "\n" + id + "\n" }

// claim takes a free slot for sandbox id and records it in the sandbox's
// state dir. The search starts after the last slot handed out, so a slot
// just released is the last to be reused.
func (s *slots) claim(id, sandboxDir string) (uint32, error) {
	n := s.max - s.min + 1
	start := s.next.Load()
	for i := uint32(0); i < n; i++ {
		k := s.min + (start-s.min+i)%n
		f, err := os.OpenFile(s.claimPath(k), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("claim uid slot: %w", err)
		}
		_, err = f.WriteString(s.owner(id))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(sandboxDir, slotFile), []byte(strconv.FormatUint(uint64(k), 10)+"\n"), 0o600)
		}
		if err != nil {
			os.Remove(s.claimPath(k))
			return 0, fmt.Errorf("claim uid slot: %w", err)
		}
		s.next.Store(s.min + (k-s.min+1)%n)
		return k, nil
	}
	return 0, fmt.Errorf("no free uid slot: %w", errdefs.ErrResourceExhausted)
}

// upcoming returns up to n slots that claim would hand out next, as the
// claims stand now (a create in between may take one first).
func (s *slots) upcoming(n int) []uint32 {
	span := s.max - s.min + 1
	start := s.next.Load()
	var out []uint32
	for i := uint32(0); i < span && len(out) < n; i++ {
		k := s.min + (start-s.min+i)%span
		if _, err := os.Lstat(s.claimPath(k)); errors.Is(err, fs.ErrNotExist) {
			out = append(out, k)
		}
	}
	return out
}

// lookup returns the slot recorded in a sandbox's state dir.
func (s *slots) lookup(sandboxDir string) (uint32, bool) {
	b, err := os.ReadFile(filepath.Join(sandboxDir, slotFile))
	if err != nil {
		return 0, false
	}
	k, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil || uint32(k) < s.min || uint32(k) > s.max {
		return 0, false
	}
	return uint32(k), true
}

// release drops the claim this runtime holds for sandbox id, recorded as
// slot k (when ok) in its state dir. Without a matching record it scans the claim files: a crash
// between claiming and recording leaves a claim with no record.
func (s *slots) release(id string, k uint32, ok bool) error {
	owner := s.owner(id)
	if ok {
		if b, err := os.ReadFile(s.claimPath(k)); err == nil && string(b) == owner {
			// The usual case: one file, no scan of every claim.
			if err := os.Remove(s.claimPath(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		}
	}
	var errs []error
	s.each(func(k uint32, o string) {
		if o == owner {
			if err := os.Remove(s.claimPath(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// releaseOrphans drops this runtime's claims whose sandbox has no state
// dir any more (a daemon killed between claiming and cleaning up).
func (s *slots) releaseOrphans(sandboxDir func(id string) string) {
	prefix := s.stateDir + "\n"
	s.each(func(k uint32, o string) {
		id, ok := strings.CutPrefix(o, prefix)
		if !ok {
			// Another daemon's claim: stale only if that daemon's whole
			// state dir is gone (it is made before any claim).
			if dir, _, found := strings.Cut(o, "\n"); found && filepath.IsAbs(dir) {
				if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
					os.Remove(s.claimPath(k))
				}
			}
			return
		}
		id = strings.TrimSuffix(id, "\n")
		if _, err := os.Stat(sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
			os.Remove(s.claimPath(k))
		}
	})
}

// each calls fn for every claim file with its owner text.
func (s *slots) each(fn func(k uint32, owner string)) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		k, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			continue
		}
		fn(uint32(k), string(b))
	}
}

// HostUID returns the first host uid (and gid) of sandbox id's range: the
// host uid of its root.
func (r *Runtime) HostUID(id string) (uint32, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	k, ok := r.slots.lookup(r.dir(id))
	if !ok {
		return 0, fmt.Errorf("sandbox %s: no uid range recorded: %w", id, errdefs.ErrNotFound)
	}
	return hostBase(k), nil
}
