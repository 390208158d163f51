package runtime

import (
	"context"
	"errors"
	"path"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestCheckMountDestination(t *testing.T) {
	for _, ok := range []string{"/data", "/home/user/cache", "/tmp/x", "/procs", "/devices/a", "/.berthx"} {
		if err := CheckMountDestination(ok); err != nil {
			t.Errorf("CheckMountDestination(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "data", "/", "/data/", "/a/../b", "/a//b", "/./a", "/proc", "/proc/x", "/sys/fs", "/dev", "/dev/shm", "/.berth", "/.berth/berth-agent", "/a\x00b", "/" + strings.Repeat("a", 4096)} {
		if err := CheckMountDestination(bad); err == nil {
			t.Errorf("CheckMountDestination(%q) = nil, want an error", bad)
		}
	}
}

// FuzzCheckMountDestination: whatever it accepts is absolute, clean, not
// the root and off the reserved trees.
func FuzzCheckMountDestination(f *testing.F) {
	for _, s := range []string{"/data", "/proc/../data", "/dev", "/.berth/x", "//", "/a/./b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dst string) {
		if CheckMountDestination(dst) != nil {
			return
		}
		if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" || strings.ContainsRune(dst, 0) {
			t.Fatalf("accepted %q", dst)
		}
		for _, r := range reservedPaths {
			if dst == r || strings.HasPrefix(dst, r+"/") {
				t.Fatalf("accepted %q, on %s", dst, r)
			}
		}
	})
}

// ExitsWithin: an exit seen (before or during the grace) is true; a grace
// that runs out, a watch that fails or a context that ends is false.
func TestExitsWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		closed := make(chan struct{})
		close(closed)
		if !ExitsWithin(t.Context(), time.Second, func(context.Context) (<-chan struct{}, error) { return closed, nil }) {
			t.Error("an exit already seen: false")
		}
		later := make(chan struct{})
		// Inside the synctest bubble the clock is virtual: this sleep
		// is the exit arriving half-way through the grace, not a wait.
		go func() { time.Sleep(500 * time.Millisecond); close(later) }()
		if !ExitsWithin(t.Context(), time.Second, func(context.Context) (<-chan struct{}, error) { return later, nil }) {
			t.Error("an exit within the grace: false")
		}
		never := make(chan struct{})
		if ExitsWithin(t.Context(), time.Second, func(context.Context) (<-chan struct{}, error) { return never, nil }) {
			t.Error("no exit: true")
		}
		if ExitsWithin(t.Context(), time.Second, func(context.Context) (<-chan struct{}, error) { return nil, errors.New("no pidfd") }) {
			t.Error("a failed watch: true")
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if ExitsWithin(ctx, time.Second, func(context.Context) (<-chan struct{}, error) { return never, nil }) {
			t.Error("an ended context: true")
		}
	})
}
