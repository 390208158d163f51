package runtimetest

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// agentSource is the test agent: a tiny static program that stands in for
// berth-agent. Run with no arguments it writes a marker and sleeps forever,
// like an agent serving requests. Its other modes give the suite
// deterministic workloads to run inside a sandbox:
//
//	hog          allocate and touch memory until killed
//	fill PATH    write zeros to PATH until an error; print "ENOSPC" on a full disk
//	probe        try syscalls the sandbox must refuse; print name=errno lines
//	count PATH   count in memory, writing "token n checksum" to PATH
//	secret PATH  write the secret (TEST_SECRET, or read from the pipe
//	             TEST_SECRET_FD names) to PATH and sleep
const agentSource = `package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		_ = os.WriteFile("/tmp/agent-started", []byte("ok\n"), 0o644)
		for {
			time.Sleep(time.Hour)
		}
	}
	switch os.Args[1] {
	case "hog":
		var keep [][]byte
		for {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
	case "fill":
		f, err := os.Create(os.Args[2])
		if err != nil {
			fmt.Println("create:", err)
			os.Exit(1)
		}
		buf := make([]byte, 1<<20)
		for {
			if _, err = f.Write(buf); err != nil {
				break
			}
		}
		if err == nil {
			err = f.Sync()
		}
		if errors.Is(err, syscall.ENOSPC) {
			fmt.Println("ENOSPC")
			return
		}
		fmt.Println("unexpected:", err)
		os.Exit(1)
	case "probe":
		probe()
	case "count":
		count(os.Args[2])
	case "raise":
		raise()
	case "raised":
		raised(os.Args[2])
	case "secret":
		secret(os.Args[2])
	case "exit":
		// An agent that dies while starting, saying why.
		fmt.Fprintln(os.Stderr, "fixture agent: giving up at once")
		os.Exit(3)
	default:
		fmt.Println("unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// secret writes the secret the runtime handed it to path, "" when it
// got none, and sleeps.
func secret(path string) {
	v := os.Getenv("TEST_SECRET")
	if s := os.Getenv("TEST_SECRET_FD"); s != "" {
		fd, err := strconv.Atoi(s)
		if err != nil {
			fmt.Println("secret fd:", err)
			os.Exit(1)
		}
		f := os.NewFile(uintptr(fd), "secret")
		b, err := io.ReadAll(f)
		if err != nil {
			fmt.Println("read the secret:", err)
			os.Exit(1)
		}
		f.Close()
		v = string(b)
	}
	_ = os.WriteFile(path, []byte(v+"\n"), 0o644)
	for {
		time.Sleep(time.Hour)
	}
}

// count keeps a random token and 4 MiB of random bytes in memory and
// counts, writing "token n checksum" to path after each step: a process
// restored from a checkpoint goes on with the same token, checksum and a
// growing n, while a restarted one would start over with new ones.
// raise, as the sandbox's root, makes a set-user-ID copy of itself and a
// FIFO, becomes uid 1000 and runs the copy: what "sudo" is to a user.
func raise() {
	self, err := os.ReadFile("/proc/self/exe")
	if err == nil {
		err = os.WriteFile("/tmp/raise", self, 0o755)
	}
	if err == nil {
		err = syscall.Chmod("/tmp/raise", 0o4755) // os.Chmod drops a raw set-uid bit
	}
	if err == nil {
		err = syscall.Mkfifo("/tmp/hold", 0o666)
	}
	if err == nil {
		err = syscall.Setgroups(nil)
	}
	if err == nil {
		err = syscall.Setresgid(1000, 1000, 1000)
	}
	if err == nil {
		err = syscall.Setresuid(1000, 1000, 1000)
	}
	if err == nil {
		err = syscall.Exec("/tmp/raise", []string{"/tmp/raise", "raised", "/tmp/hold"}, nil)
	}
	fmt.Println("raise:", err)
	os.Exit(1)
}

// raised reports its uids as the sandbox sees them and holds until the
// FIFO at path is written, so the host can look at it meanwhile.
func raised(path string) {
	fmt.Printf("ruid=%d euid=%d\n", syscall.Getuid(), syscall.Geteuid())
	f, err := os.Open(path)
	if err != nil {
		fmt.Println("hold:", err)
		os.Exit(1)
	}
	f.Close()
}

func count(path string) {
	var tok [8]byte
	buf := make([]byte, 4<<20)
	if _, err := rand.Read(tok[:]); err != nil {
		os.Exit(1)
	}
	if _, err := rand.Read(buf); err != nil {
		os.Exit(1)
	}
	for n := 1; ; n++ {
		h := fnv.New64a()
		h.Write(buf)
		line := fmt.Sprintf("%x %d %x\n", tok, n, h.Sum64())
		if err := os.WriteFile(path+".tmp", []byte(line), 0o644); err == nil {
			_ = os.Rename(path+".tmp", path)
		}
		time.Sleep(20 * time.Millisecond) // the workload's pace, not a test wait
	}
}

func probe() {
	report := func(name string, err error) {
		var errno syscall.Errno
		switch {
		case err == nil:
			fmt.Printf("%s=0\n", name)
		case errors.As(err, &errno):
			fmt.Printf("%s=%d\n", name, int(errno))
		default:
			fmt.Printf("%s=%v\n", name, err)
		}
	}
	raw := func(name string, trap uintptr, a ...uintptr) {
		a = append(a, 0, 0, 0)
		_, _, e := syscall.RawSyscall(trap, a[0], a[1], a[2])
		if e == 0 {
			report(name, nil)
			return
		}
		report(name, e)
	}
	report("unshare_none", syscall.Unshare(0))
	report("unshare_user", syscall.Unshare(syscall.CLONE_NEWUSER))
	raw("clone3", 435)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.Close(fd)
	}
	report("socket_tcp", err)
	_, err = syscall.Socket(17, syscall.SOCK_RAW, 0)
	report("socket_packet", err)
	_, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.IPPROTO_ICMP)
	report("socket_raw", err)
	report("mount", syscall.Mount("none", "/tmp", "tmpfs", 0, ""))
	raw("keyctl", syscall.SYS_KEYCTL, 0, ^uintptr(2))
	// Numbers the frozen syscall package lacks.
	nr := map[string][3]uintptr{"amd64": {321, 323, 308}, "arm64": {280, 282, 268}}[runtime.GOARCH]
	sysBPF, sysUserfaultfd, sysSetns := nr[0], nr[1], nr[2]
	raw("bpf", sysBPF, 0, 0, 0)
	raw("io_uring_setup", 425, 1, 0)
	raw("userfaultfd", sysUserfaultfd, 0)
	raw("setns", sysSetns, ^uintptr(0), 0)
	report("ptrace", syscall.PtraceAttach(1))
	raw("perf_event_open", syscall.SYS_PERF_EVENT_OPEN, 0, 0, 0)
}
`

// BuildAgent compiles the test agent (static, CGO_ENABLED=0) into dir and
// returns its path. Harnesses use it as runtime.Spec.AgentPath; the suite
// relies on its modes.
func BuildAgent(t testing.TB, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "agent-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(agentSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module testagent\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "test-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test agent: %v\n%s", err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// busyboxApplets are linked into the test rootfs; the suite's shell
// snippets use only these.
var busyboxApplets = []string{"sh", "cat", "echo", "ls", "sleep", "setsid", "hostname",
	"dd", "rm", "mkdir", "id", "true", "false", "head", "ps", "kill"}

// SandboxReadableDir returns a new test directory that a sandbox's host
// uid can reach: the directories above it, up to the system's temporary
// directory, are opened to others (t.TempDir makes them 0700).
func SandboxReadableDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// BusyboxLayer builds a minimal root filesystem layer in dir from the
// host's static busybox, owned by uid:uid (the sandbox's root as the host
// sees it). It skips the test if no static busybox is installed.
func BusyboxLayer(t testing.TB, dir string, uid uint32) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static)")
	}
	if out, err := exec.Command("file", "-L", bb).CombinedOutput(); err == nil && !containsAny(string(out), "statically linked", "static-pie") {
		t.Skipf("%s is not static (apt-get install busybox-static)", bb)
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(uid), int(uid))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
