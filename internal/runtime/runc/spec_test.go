package runc

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/internal/runtime"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestOCISpecGolden pins the generated OCI config: any change to the
// sandbox's isolation shows up as a diff of the golden file.
func TestOCISpecGolden(t *testing.T) {
	r := &Runtime{
		cfg:      Config{UIDBase: 1000000, UIDCount: 65536, CgroupParent: "berth-test"},
		swapAcct: true,
		nofile:   65536,
		nsNproc:  true,
		// The daemon's own limits cap these; the golden file pins the
		// uncapped values.
		sigpending: sigpendingLimit,
		msgqueue:   msgqueueLimit,
	}
	cases := []struct {
		name string
		spec runtime.Spec
	}{
		{"own-netns", runtime.Spec{
			ID: "sb1", Layers: []string{"/layers/base", "/layers/top"}, DiskBytes: 1 << 30,
			CPUMillis: 1500, MemoryBytes: 512 << 20, PidsLimit: 256, Hostname: "sb1",
			AgentPath: "/usr/lib/berth/berth-agent", AgentArgs: []string{"--port", "49983"},
			AgentEnv: []string{"BERTH_TOKEN=x"},
		}},
		{"joined-netns", runtime.Spec{
			ID: "sb2", Layers: []string{"/layers/base"}, DiskBytes: 1 << 30,
			Hostname: "sb2", NetNSPath: "/run/netns/sb2", AgentPath: "/usr/lib/berth/berth-agent",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := json.MarshalIndent(r.ociSpec(c.spec, "/state/"+c.spec.ID+"/rootfs", 1000000), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", c.name+"-"+goruntime.GOARCH+".json")
			if *update {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if os.IsNotExist(err) && goruntime.GOARCH != "amd64" {
				t.Skipf("no golden file for %s", goruntime.GOARCH)
			}
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if string(want) != string(got)+"\n" {
				t.Errorf("OCI spec for %s differs from %s (run with -update and review the diff):\n%s", c.name, golden, got)
			}
		})
	}
}

func TestSeccompArches(t *testing.T) {
	cases := []struct {
		goarch string
		want   int
	}{{"amd64", 3}, {"arm64", 2}, {"riscv64", 0}}
	for _, c := range cases {
		if got := seccompArches(c.goarch); len(got) != c.want {
			t.Errorf("seccompArches(%q) = %v, want %d arches", c.goarch, got, c.want)
		}
	}
}

func TestNprocPerUserNS(t *testing.T) {
	cases := []struct {
		release string
		want    bool
	}{
		{"6.18.44-fc-v782", true},
		{"5.14.0-362.el9.x86_64", true},
		{"5.13.19", false},
		{"5.10.0-28-amd64", false},
		{"4.19.0", false},
		{"", false},
		{"garbage", false},
	}
	for _, c := range cases {
		if got := nprocPerUserNS(c.release); got != c.want {
			t.Errorf("nprocPerUserNS(%q) = %v, want %v", c.release, got, c.want)
		}
	}
}

// The pool and vsock rules: AF_VSOCK is matched on the low 32 bits of
// socket's and socketpair's family, the AIO calls answer ENOSYS, fanotify
// EPERM.
func TestSeccompPoolRules(t *testing.T) {
	var vsock, aio, fanotify bool
	for _, sc := range seccompProfile().Syscalls {
		names := strings.Join(sc.Names, ",")
		switch {
		case names == "socket,socketpair":
			vsock = len(sc.Args) == 1 && sc.Args[0] == int32Arg(0, afVSOCK) && *sc.ErrnoRet == errnoEPERM
		case strings.HasPrefix(names, "io_setup,"):
			aio = *sc.ErrnoRet == errnoENOSYS && strings.Contains(names, "io_submit") && len(sc.Args) == 0
		case names == "fanotify_init,fanotify_mark":
			fanotify = *sc.ErrnoRet == errnoEPERM && len(sc.Args) == 0
		}
	}
	if !vsock || !aio || !fanotify {
		t.Errorf("rules: vsock %v, aio %v, fanotify %v", vsock, aio, fanotify)
	}
	if a := int32Arg(0, afVSOCK); a.Value != low32 || a.ValueTwo != 40 || a.Op != specs.OpMaskedEqual {
		t.Errorf("vsock arg %+v", a)
	}
}
