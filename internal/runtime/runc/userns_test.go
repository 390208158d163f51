package runc

import (
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"sync"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
)

func TestIDMaps(t *testing.T) {
	m := []specs.LinuxIDMapping{{ContainerID: 1, HostID: 5, Size: 1}, {ContainerID: 0, HostID: 1000000, Size: 65536}}
	if got := idMapText(m); got != "1 5 1\n0 1000000 65536\n" {
		t.Errorf("idMapText = %q", got)
	}
	if id, ok := hostID(m); !ok || id != 1000000 {
		t.Errorf("hostID = %d, %v; want 1000000", id, ok)
	}
	if _, ok := hostID([]specs.LinuxIDMapping{{ContainerID: 1, HostID: 5, Size: 1}}); ok {
		t.Errorf("hostID found container root in a map without it")
	}
}

// The spec handed to runc joins the daemon's user namespace and no host
// network namespace (runc could not enter it after the user namespace);
// its rlimits go to runc's own command line.
func TestJoinSpec(t *testing.T) {
	r := &Runtime{cfg: Config{UIDBase: 1000000, UIDCount: 65536, CgroupParent: "berth-test"}, nofile: 1024, sigpending: 16, msgqueue: 32}
	sp := r.ociSpec(goldenSpec("/run/netns/x"), "/rootfs", 1000000)
	joinUserNS(sp, "/proc/42/ns/user")
	if got := inheritNetNS(sp); got != "/run/netns/x" {
		t.Errorf("inheritNetNS = %q", got)
	}
	var types []specs.LinuxNamespaceType
	for _, n := range sp.Linux.Namespaces {
		types = append(types, n.Type)
		if n.Type == specs.UserNamespace && n.Path != "/proc/42/ns/user" {
			t.Errorf("user namespace path %q", n.Path)
		}
		if n.Type == specs.NetworkNamespace {
			t.Errorf("network namespace still in the spec: %+v", n)
		}
	}
	if len(types) != 6 {
		t.Errorf("namespaces %v", types)
	}
	rl := takeRlimits(sp)
	if sp.Process.Rlimits != nil || len(rl) == 0 {
		t.Fatalf("rlimits left in the spec: %v", sp.Process.Rlimits)
	}
	cmd := exec.Command("/usr/sbin/runc", "create", "x")
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("no prlimit")
	}
	if err := withRlimits(cmd, rl); err != nil {
		t.Fatal(err)
	}
	want := []string{"--nofile=1024:1024", "--core=0:0", "--sigpending=16:16", "--msgqueue=32:32", "--rtprio=0:0", "--nice=0:0", "--", "/usr/sbin/runc", "create", "x"}
	if !reflect.DeepEqual(cmd.Args[1:], want) {
		t.Errorf("runc command line %q, want %q", cmd.Args[1:], want)
	}
}

func goldenSpec(netns string) runtime.Spec {
	return runtime.Spec{ID: "sb", Layers: []string{"/l"}, DiskBytes: 1 << 30, AgentPath: "/agent", NetNSPath: netns}
}

// TestIdmapPrefetch: a prefetched namespace is the one every later get
// of its uid returns, concurrent gets while it is made wait for it rather
// than make another, and a closed cache hands out none.
func TestIdmapPrefetch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (user namespaces mapping other uids)")
	}
	var c idmapNS
	const inner, outer, count = 1000000, 50 * slotSize, 65536
	c.prefetch(inner, outer, count, slog.New(slog.DiscardHandler))
	var wg sync.WaitGroup
	got := make([]*os.File, 4)
	for i := range got {
		wg.Go(func() {
			f, err := c.get(inner, outer, count)
			if err != nil {
				t.Error(err)
			}
			got[i] = f
		})
	}
	wg.Wait()
	for _, f := range got[1:] {
		if f != got[0] {
			t.Fatalf("gets of one uid returned different namespaces: %v", got)
		}
	}
	c.mu.Lock()
	n, busy := len(c.fds), len(c.inflight)
	c.mu.Unlock()
	if n != 1 || busy != 0 {
		t.Errorf("kept %d namespaces with %d being made, want 1 and 0", n, busy)
	}
	// A freed slot's namespace is closed and forgotten; a later get
	// makes a new one.
	c.drop(outer)
	if err := unix.Fstat(int(got[0].Fd()), new(unix.Stat_t)); err == nil {
		t.Error("a dropped namespace's descriptor is still open")
	}
	again, err := c.get(inner, outer, count)
	if err != nil || again == nil {
		t.Fatalf("get after drop = %v, %v", again, err)
	}
	c.close()
	if _, err := c.get(inner, outer+slotSize, count); err == nil {
		t.Error("get after close made a namespace")
	}
	c.prefetch(inner, outer+slotSize, count, slog.New(slog.DiscardHandler))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.inflight) != 0 || len(c.fds) != 0 {
		t.Errorf("prefetch after close: %d being made, %d kept", len(c.inflight), len(c.fds))
	}
}
