package runc

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// TestGVisorSpecAgentPids: a gVisor sandbox whose agent holds the pids
// limit gives the agent the sentry's CAP_SYS_ADMIN and lets mount and
// umount2 through seccomp, and nothing else; without AgentPids neither.
// The host pids wall is sized for the ptrace stubs either way.
func TestGVisorSpecAgentPids(t *testing.T) {
	r := &Runtime{cfg: Config{UIDBase: 1000000, UIDCount: 65536, CgroupParent: "berth-test"}, nofile: 65536}
	// AllowSetuid (E2B creates ask for it) must not leave the agent
	// without no_new_privs: agent.DenyMounts needs it once it has
	// dropped CAP_SYS_ADMIN.
	base := runtime.Spec{ID: "sb1", PidsLimit: 64, MemoryBytes: 64 << 20, AgentPath: "/agent", AllowSetuid: true}
	for _, agentPids := range []bool{false, true} {
		s := base
		s.AgentPids = agentPids
		sp := r.ociSpec(s, "/rootfs", 1065536)
		before := seccompNames(sp.Linux.Seccomp.Syscalls)
		gvisorSpec(sp, s, "/proc/1/ns/net")
		c := sp.Process.Capabilities
		for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
			if got := slices.Contains(set, "CAP_SYS_ADMIN"); got != agentPids {
				t.Errorf("AgentPids %v: CAP_SYS_ADMIN in %s = %v", agentPids, name, got)
			}
		}
		after := seccompNames(sp.Linux.Seccomp.Syscalls)
		for _, n := range before {
			allowed := slices.Contains(agentMountCalls, n)
			if got := slices.Contains(after, n); got == (agentPids && allowed) {
				t.Errorf("AgentPids %v: seccomp rule for %s kept = %v", agentPids, n, got)
			}
		}
		if agentPids && !sp.Process.NoNewPrivileges {
			t.Errorf("AgentPids with AllowSetuid: no_new_privs off, want on")
		}
		if got, want := *sp.Linux.Resources.Pids.Limit, int64(16*64+256); got != want {
			t.Errorf("host pids limit = %d, want %d", got, want)
		}
		// A restore adapts the stored, already adapted config again:
		// nothing may compound (a pids wall multiplied each resume
		// ended past what the kernel accepts).
		caps := len(sp.Process.Capabilities.Bounding)
		gvisorSpec(sp, s, "/proc/1/ns/net")
		if got, want := *sp.Linux.Resources.Pids.Limit, int64(16*64+256); got != want {
			t.Errorf("host pids limit after a second pass = %d, want %d", got, want)
		}
		if got := len(sp.Process.Capabilities.Bounding); got != caps {
			t.Errorf("bounding set after a second pass has %d entries, want %d", got, caps)
		}
	}
	// The runc profile the gVisor one is cut from stays whole.
	if names := seccompNames(seccompProfile().Syscalls); !slices.Contains(names, "mount") || !slices.Contains(names, "umount2") {
		t.Errorf("runc seccomp profile lost its mount rules: %v", names)
	}
}

func seccompNames(rules []specs.LinuxSyscall) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.Names...)
	}
	return out
}
