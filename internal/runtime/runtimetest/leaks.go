package runtimetest

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
	var out []string
	eachMountinfo(func(fields []string) {
		out = append(out, unescape(fields[4]))
	})
	return out
}

// cgroupMounts returns the mount points of all cgroup hierarchies.
func cgroupMounts() []string {
	var out []string
	eachMountinfo(func(fields []string) {
		sep := slices.Index(fields, "-")
		if sep > 0 && sep+1 < len(fields) && (fields[sep+1] == "cgroup" || fields[sep+1] == "cgroup2") {
			out = append(out, unescape(fields[4]))
		}
	})
	return out
}

func eachMountinfo(fn func(fields []string)) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 5 {
			fn(fields)
		}
	}
}

func unescape(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
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
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && (parts[2] == cg || strings.HasPrefix(parts[2], cg+"/")) {
				out = append(out, e.Name())
				break
			}
		}
	}
	return out
}
