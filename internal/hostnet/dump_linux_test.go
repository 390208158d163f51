package hostnet

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestDumpRetriesInterrupted: an interrupted dump (another sandbox's link
// changed while the kernel wrote it) is run again, never used; one that
// keeps being interrupted is unavailable, and other errors pass through.
func TestDumpRetriesInterrupted(t *testing.T) {
	calls := 0
	got, err := dump(func() ([]int, error) {
		calls++
		if calls < 3 {
			return []int{1}, netlink.ErrDumpInterrupted // partial
		}
		return []int{1, 2}, nil
	})
	if err != nil || len(got) != 2 || calls != 3 {
		t.Errorf("dump after two interruptions = %v, %v (%d calls); want [1 2], nil, 3 calls", got, err, calls)
	}

	got, err = dump(func() ([]int, error) { return []int{1}, netlink.ErrDumpInterrupted })
	if !errors.Is(err, errdefs.ErrUnavailable) || got != nil {
		t.Errorf("dump always interrupted = %v, %v; want nil, unavailable", got, err)
	}

	boom := errors.New("boom")
	calls = 0
	_, err = dump(func() ([]int, error) { calls++; return nil, boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("dump with another error = %v after %d calls; want boom after 1", err, calls)
	}
}
