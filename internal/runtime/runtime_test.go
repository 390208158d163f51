package runtime

import (
	"path"
	"strings"
	"testing"
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
