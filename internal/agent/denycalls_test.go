package agent

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompFilters is the number of seccomp filters on this process, from
// /proc/self/status (Linux 5.9 and later; -1 if not shown).
func seccompFilters(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp_filters:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return -1
}

func TestParseDeniedCalls(t *testing.T) {
	got, err := parseDeniedCalls("clone3:38,no_such_call:38,,io_setup:1")
	if err != nil {
		t.Fatal(err)
	}
	want := []deniedCall{{nr: unix.SYS_CLONE3, errno: 38}, {nr: unix.SYS_IO_SETUP, errno: 1}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("parse = %+v, want %+v (an unknown name skipped)", got, want)
	}
	for _, bad := range []string{"clone3", "clone3:", "clone3:0", "clone3:x", "clone3:4096", ":38", "clone3:-1"} {
		if _, err := parseDeniedCalls(bad); err == nil && !strings.HasPrefix(bad, ":") {
			t.Errorf("parse %q succeeded, want an error", bad)
		}
	}
}

func FuzzParseDeniedCalls(f *testing.F) {
	for _, s := range []string{"clone3:38", "clone3:38,io_setup:38", "", ",", "a:b:c", "clone3:99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		calls, err := parseDeniedCalls(s)
		if err != nil {
			return
		}
		for _, c := range calls {
			if c.errno == 0 || c.errno > 4095 {
				t.Fatalf("%q gave errno %d", s, c.errno)
			}
		}
	})
}

// TestDenyCallsFilter installs the filter in a child process (a filter
// cannot be removed) and checks the child's calls: clone3 answers the
// errno asked for, ENOSYS, so glibc would fall back to clone; the mount
// calls answer EPERM; calls not named stay allowed; and it is one filter
// (each filter costs gVisor's sentry a seccomp cache rebuild per task).
func TestDenyCallsFilter(t *testing.T) {
	if os.Getenv("BERTH_TEST_DENY_CHILD") == "1" {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := Deny(true, "clone3:38,io_setup:38"); err != nil {
			t.Fatal(err)
		}
		if n := seccompFilters(t); n != 1 && n != -1 {
			t.Fatalf("%d seccomp filters installed, want 1", n)
		}
		// clone3 with a bad size: EINVAL from the kernel, ENOSYS when
		// the filter answers first.
		if _, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); !errors.Is(e, unix.ENOSYS) {
			t.Fatalf("clone3 = %v, want ENOSYS", e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_IO_SETUP, 0, 0, 0); !errors.Is(e, unix.ENOSYS) {
			t.Fatalf("io_setup = %v, want ENOSYS", e)
		}
		// umount2 of a path that does not exist: ENOENT (root) or
		// EPERM (not) from the kernel; the filter answers EPERM first.
		// The run as root (CI) tells them apart.
		p, _ := unix.BytePtrFromString("/berth-no-such-mount")
		if _, _, e := unix.RawSyscall(unix.SYS_UMOUNT2, uintptr(unsafe.Pointer(p)), 0, 0); !errors.Is(e, unix.EPERM) {
			t.Fatalf("umount2 = %v, want EPERM", e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0); e != 0 {
			t.Fatalf("getpid = %v, want allowed", e)
		}
		return
	}
	// The child is this test built without cgo, as the agent is: with
	// cgo, AllThreadsSyscall refuses (EOPNOTSUPP).
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH to build the child")
	}
	cmd := exec.Command(gobin, "test", "-count=1", "-run=^TestDenyCallsFilter$", "-v", ".")
	cmd.Env = append(os.Environ(), "BERTH_TEST_DENY_CHILD=1", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestDenyCallsFilter") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	// Without the filter the kernel answers clone3 itself.
	if _, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); errors.Is(e, unix.ENOSYS) {
		t.Skipf("this kernel has no clone3 (%v): the child's ENOSYS proves nothing", e)
	}
}
