package hostnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Address reservations. A sandbox's /30 is chosen under the host-wide lock
// and recorded there as an empty file in the reservation directory, named
//
//	<network address>_<instance>_<sandbox id>
//
// before the lock is released; the netns, veth, addresses and routes are
// then made without it, so concurrent creates (of every daemon on the
// host) serialise only on picking a number, not on netlink work.
//
// The file lives as long as the attachment: Detach removes it after the
// link. So it is one more of the sandbox's host objects: List reports an
// id that has one, and a daemon killed between reserving and configuring
// leaves a reservation its next start finds (reconcile lists and detaches
// it) instead of an address that is neither on a link nor free. Another
// allocator never hands out a reserved /30, whether or not its address is
// on a link yet. The directory is on /run (tmpfs): a reboot, which also
// removes every link, forgets every reservation, and the files need no
// fsync.
//
// Allocation still skips every address and route the kernel shows, read
// under the lock: that covers the host's own networks and daemons that
// predate reservations (which held the lock until their address was up).

// reservationName is the file name of id's reservation of p.
func (n *Network) reservationName(p netip.Prefix, id string) string {
	return p.Addr().String() + "_" + n.cfg.Instance + "_" + id
}

// reservation is one parsed reservation file name.
type reservation struct {
	prefix       netip.Prefix
	instance, id string
}

func parseReservation(name string) (reservation, bool) {
	addr, rest, ok := strings.Cut(name, "_")
	if !ok {
		return reservation{}, false
	}
	inst, id, ok := strings.Cut(rest, "_")
	if !ok || !instanceRE.MatchString(inst) || validID(id) != nil {
		return reservation{}, false
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() {
		return reservation{}, false
	}
	return reservation{prefix: netip.PrefixFrom(a, 30).Masked(), instance: inst, id: id}, true
}

// reservations lists every reservation on the host (every instance's).
func (n *Network) reservations() ([]reservation, error) {
	d, err := os.Open(n.cfg.ReserveDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("address reservations: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("address reservations: %w", err)
	}
	out := make([]reservation, 0, len(names))
	for _, name := range names {
		if r, ok := parseReservation(name); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// ownReservations returns the file names of id's reservations (normally
// none or one).
func (n *Network) ownReservations(id string) ([]string, error) {
	rs, err := n.reservations()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rs {
		if r.instance == n.cfg.Instance && r.id == id {
			out = append(out, n.reservationName(r.prefix, id))
		}
	}
	return out, nil
}

// reserve picks a free /30 for id (prefer's, when that is free) and
// records it, under the host-wide lock.
func (n *Network) reserve(ctx context.Context, id string, prefer netip.Addr) (netip.Prefix, error) {
	unlock, err := lockFile(ctx, n.cfg.LockPath)
	if err != nil {
		return netip.Prefix{}, err
	}
	defer unlock()
	used, err := usedPrefixes()
	if err != nil {
		return netip.Prefix{}, err
	}
	rs, err := n.reservations()
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, r := range rs {
		used = append(used, r.prefix)
	}
	p, ok := preferred(n.cfg.Pool, prefer, used)
	if !ok {
		if p, err = allocateFrom(n.cfg.Pool, id, used); err != nil {
			return netip.Prefix{}, err
		}
	}
	f, err := os.OpenFile(filepath.Join(n.cfg.ReserveDir, n.reservationName(p, id)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("reserve %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return netip.Prefix{}, fmt.Errorf("reserve %s: %w", p, err)
	}
	return p, nil
}

// release removes id's reservations; Detach calls it once the link (and
// with it the address) is gone.
func (n *Network) release(id string) error {
	names, err := n.ownReservations(id)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := os.Remove(filepath.Join(n.cfg.ReserveDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("release address: %w", err))
		}
	}
	return errors.Join(errs...)
}

// procLocks serialises lockFile callers of one process per path before
// they reach the flock, so they wait on a channel (woken the moment the
// holder is done) and only processes poll the flock against each other.
var procLocks sync.Map // path -> chan struct{}

// lockFile takes an exclusive flock on path: first the process's own lock
// for path, then the flock, polling so ctx can cancel the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	v, _ := procLocks.LoadOrStore(path, make(chan struct{}, 1))
	held := v.(chan struct{})
	select {
	case held <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		<-held
		return nil, fmt.Errorf("open pool lock: %w", err)
	}
	fail := func(err error) (func(), error) {
		f.Close()
		<-held
		return nil, err
	}
	// Holders keep the flock for well under a millisecond now, so the
	// poll starts tight and backs off only while another process holds it
	// long (an older daemon that configures the link under the lock).
	wait := 200 * time.Microsecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close(); <-held }, nil // closing releases the flock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fail(fmt.Errorf("lock %s: %w", path, err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fail(fmt.Errorf("lock %s: %w", path, ctx.Err()))
		case <-t.C:
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}
