package runtimetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/berth-sandbox/berth/test/harness"
)

// Footprint says where a backend leaves traces of a sandbox on the host.
// The leak checks look there.
type Footprint struct {
	// StateDir holds per-sandbox directories StateDir/<id>.
	StateDir string
	// RuncRoot is the OCI runtime's state directory ("" if none): runc's
	// or runsc's.
	RuncRoot string
	// CgroupParent is the cgroup every sandbox's cgroup sits under
	// (without slashes), as in runc.Config.
	CgroupParent string
	// SlotDir holds host-wide claims on uid ranges, one file each whose
	// content is "<StateDir>\n<id>\n" ("" if the backend has none).
	SlotDir string
}

// AssertNoLeaks fails t if anything of sandbox id is left on the host: a
// mount under StateDir/<id>, a loop device backed by a file there, its
// cgroup in any hierarchy, StateDir/<id> itself, runc state, or any live
// process in the sandbox's cgroup.
func AssertNoLeaks(t testing.TB, fp Footprint, id string) {
	t.Helper()
	for _, p := range Leaks(fp, id) {
		t.Errorf("sandbox %s leaked: %s", id, p)
	}
}

// Leaks lists what is left of sandbox id on the host; empty means clean.
func Leaks(fp Footprint, id string) []string {
	var out []string
	dir := filepath.Join(fp.StateDir, id)
	for _, mp := range mountPoints() {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, "mount "+mp)
		}
	}
	for _, dev := range loopDevicesUnder(dir) {
		out = append(out, "loop device "+dev)
	}
	if _, err := os.Lstat(dir); err == nil {
		out = append(out, "state dir "+dir)
	}
	if fp.RuncRoot != "" {
		if _, err := os.Lstat(filepath.Join(fp.RuncRoot, id)); err == nil {
			out = append(out, "runc state "+filepath.Join(fp.RuncRoot, id))
		}
		// runsc keeps flat files: <id>_sandbox:<sandbox id>.state, .lock.
		files, _ := filepath.Glob(filepath.Join(fp.RuncRoot, id+"_sandbox:*"))
		for _, f := range files {
			out = append(out, "runsc state "+f)
		}
	}
	if fp.SlotDir != "" {
		out = append(out, slotClaims(fp.SlotDir, fp.StateDir, id)...)
	}
	if fp.CgroupParent != "" {
		cg := "/" + strings.Trim(fp.CgroupParent, "/") + "/" + id
		for _, m := range cgroupMounts() {
			if _, err := os.Lstat(filepath.Join(m, cg)); err == nil {
				out = append(out, "cgroup "+filepath.Join(m, cg))
			}
		}
		for _, pid := range processesInCgroup(cg) {
			out = append(out, "process "+pid)
		}
	}
	return out
}

// slotClaims lists the uid range claims in dir held for id of stateDir.
func slotClaims(dir, stateDir, id string) []string {
	var out []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil && string(b) == stateDir+"\n"+id+"\n" {
			out = append(out, "uid range claim "+filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// mountPoints returns every mount point in this mount namespace.
func mountPoints() []string {
	return mountPointsOf(mountinfo.GetMounts(nil))
}

// cgroupMounts returns the mount points of all cgroup hierarchies.
func cgroupMounts() []string {
	return mountPointsOf(mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2")))
}

// mountPointsOf lists the mount points; a mount table that cannot be read
// lists none, and the other checks still run.
func mountPointsOf(mounts []*mountinfo.Info, err error) []string {
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, m.Mountpoint)
	}
	return out
}

// loopDevicesUnder returns loop devices whose backing file is below dir.
func loopDevicesUnder(dir string) []string {
	var out []string
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		bf := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if strings.HasPrefix(bf, dir+"/") {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(m)))+" -> "+bf)
		}
	}
	return out
}

// processesInCgroup returns the pids of live processes whose cgroup (in
// any hierarchy) is cg or below it. This catches processes that left the
// sandbox's process tree (setsid, double fork) but not its cgroup.
func processesInCgroup(cg string) []string {
	var out []string
	for _, p := range harness.Procs(func(p harness.Proc) bool {
		for _, line := range strings.Split(p.Cgroup, "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && (parts[2] == cg || strings.HasPrefix(parts[2], cg+"/")) {
				return true
			}
		}
		return false
	}) {
		out = append(out, strconv.Itoa(p.PID))
	}
	return out
}

// StoppedSandboxLeaks lists what is left of a stopped sandbox id (see
// Stopper) beyond what it may keep: its state directory (the disk image
// with its writable layer) and its uid range claim. A mount, a loop device,
// runc state, a cgroup or a process is a leak.
func StoppedSandboxLeaks(fp Footprint, id string) []string {
	var out []string
	for _, l := range Leaks(fp, id) {
		if strings.HasPrefix(l, "state dir ") || strings.HasPrefix(l, "uid range claim ") {
			continue
		}
		out = append(out, l)
	}
	return out
}
