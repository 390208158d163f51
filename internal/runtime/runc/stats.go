package runc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Stats reads the sandbox's resource use straight from its cgroup files
// (cheaper than `runc events --stats`, and it reports OOM kills on both
// cgroup versions) and its disk image's filesystem.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if err := checkID(id); err != nil {
		return runtime.Stats{}, err
	}
	if _, err := os.Stat(r.procsDir(id)); errors.Is(err, fs.ErrNotExist) {
		return runtime.Stats{}, fmt.Errorf("stats sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	var s runtime.Stats
	var err error
	if r.cg.v2 {
		err = r.statsV2(id, &s)
	} else {
		err = r.statsV1(id, &s)
	}
	if err != nil {
		return s, fmt.Errorf("stats sandbox %s: %w", id, err)
	}
	if err := r.diskStats(id, &s); err != nil {
		return s, fmt.Errorf("stats sandbox %s: %w", id, err)
	}
	if r.cfg.GVisor != nil {
		r.sentryStats(ctx, id, &s)
	}
	return s, nil
}

// sentryStats replaces what the host cgroup cannot say about a gVisor
// sandbox: its cgroup holds the sentry and the gofer, whose memory and
// threads are not the sandbox's processes. The sentry reports its own
// processes' memory and count. The limit, the peak and OOM kills stay the
// cgroup's: that is where the limit is enforced. A sandbox whose sentry
// does not answer (stopped, checkpointed) keeps the cgroup's numbers.
//
// Asking the sentry is a `runsc events --stats`, a process start of tens
// of milliseconds of CPU that also wakes the sentry, and the monitor
// samples every sandbox once a second: 1.2 % of a core per idle sandbox
// (README). So an answer serves for defaultSentryStatsTTL, and for up to
// sentryIdleTTL while the sandbox stays idle (sentrySample.serves); the
// cgroup's own figures (CPU, OOM kills, the limit) are read fresh every
// time. s.CPUUsage must be the cgroup's, read already.
func (r *Runtime) sentryStats(ctx context.Context, id string, s *runtime.Stats) {
	if v, ok := r.sentrySamples.Load(id); ok {
		if c := v.(sentrySample); c.serves(time.Now(), s.CPUUsage, r.sentryTTL()) {
			c.apply(s)
			return
		}
	}
	out, err := r.runcOutput(ctx, "events", "--stats", id)
	if err != nil {
		return
	}
	var ev runscStats
	if json.Unmarshal(out, &ev) != nil {
		return
	}
	c := sentrySample{at: time.Now(), cpu: s.CPUUsage, memory: int64(ev.Data.Memory.Usage.Usage), pids: int64(ev.Data.Pids.Current)}
	r.sentrySamples.Store(id, c)
	c.apply(s)
}

// defaultSentryStatsTTL is how long a sentry's answer to sentryStats
// serves.
const defaultSentryStatsTTL = 5 * time.Second

func (r *Runtime) sentryTTL() time.Duration {
	if r.sentryStatsTTL != 0 {
		return r.sentryStatsTTL
	}
	return defaultSentryStatsTTL
}

// sentryIdleTTL bounds how long a sentry's answer serves a sandbox that
// stays idle; sentryIdleCPU is the CPU its cgroup may use meanwhile and
// still count as idle, besides half a percent of a core: about what
// answering the last `runsc events` itself cost the sentry (3 to 4 ms
// measured) and what an idle sentry spends (about 1 ms a second).
const (
	sentryIdleTTL = 30 * time.Second
	sentryIdleCPU = 10 * time.Millisecond
)

// sentrySample is a sentry's answer to sentryStats, kept for a while.
type sentrySample struct {
	at time.Time
	// cpu is the cgroup's CPU usage when the sentry was asked.
	cpu          time.Duration
	memory, pids int64
}

// serves reports whether the sample may stand for the sentry's answer at
// now, the cgroup having used cpu in all by then: for ttl, and after
// that, up to sentryIdleTTL, while the sandbox has used next to no CPU
// since (its processes can hardly grow or multiply without it; an idle
// sandbox's figures then come from the sentry every 30 s instead of every
// 5 s).
func (c sentrySample) serves(now time.Time, cpu, ttl time.Duration) bool {
	age := now.Sub(c.at)
	switch {
	case age < ttl:
		return true
	case age >= sentryIdleTTL:
		return false
	default:
		return cpu-c.cpu <= sentryIdleCPU+age/200
	}
}

func (c sentrySample) apply(s *runtime.Stats) {
	s.MemoryBytes = c.memory
	s.PidsCurrent = c.pids
	// The host cgroup's refusals are the sentry's threads', not the
	// sandbox's forks.
	s.PidsRefused = 0
}

func (r *Runtime) statsV1(id string, s *runtime.Stats) error {
	p := r.cgroupsPath(id)
	mem := filepath.Join(r.cg.controllers["memory"], p)
	var err error
	read := func(dir, file string) int64 {
		if err != nil {
			return 0
		}
		var v int64
		v, err = readInt(filepath.Join(dir, file))
		return v
	}
	if acct := r.cg.controllers["cpuacct"]; acct != "" {
		s.CPUUsage = time.Duration(read(filepath.Join(acct, p), "cpuacct.usage"))
	}
	s.MemoryBytes = read(mem, "memory.usage_in_bytes")
	s.MemoryMax = read(mem, "memory.max_usage_in_bytes")
	s.MemoryLimit = read(mem, "memory.limit_in_bytes")
	pids := filepath.Join(r.cg.controllers["pids"], p)
	s.PidsCurrent = read(pids, "pids.current")
	if err != nil {
		return err
	}
	if kv, err := readKV(filepath.Join(pids, "pids.events")); err == nil {
		s.PidsRefused = kv["max"]
	}
	// Where the workload has a cgroup of its own, its tasks are what the
	// limit counts (the sandbox's adds the agent's threads), and v1
	// counts a refused fork in the forking task's cgroup: the workload's
	// are in that cgroup's events.
	if work := r.workloadDir(id); work != "" {
		if n, err := readInt(filepath.Join(work, "pids.current")); err == nil {
			s.PidsCurrent = n
		}
		if kv, err := readKV(filepath.Join(work, "pids.events")); err == nil {
			s.PidsRefused += kv["max"]
		}
	}
	// v1 reports "unlimited" as a huge page-rounded number.
	if s.MemoryLimit >= 1<<62 {
		s.MemoryLimit = 0
	}
	kv, err := readKV(filepath.Join(mem, "memory.oom_control"))
	if err != nil {
		return err
	}
	s.OOMKills = kv["oom_kill"]
	return nil
}

func (r *Runtime) statsV2(id string, s *runtime.Stats) error {
	dir := filepath.Join(r.cg.unified, r.cgroupsPath(id))
	cpu, err := readKV(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return err
	}
	s.CPUUsage = time.Duration(cpu["usage_usec"]) * time.Microsecond
	if s.MemoryBytes, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
		return err
	}
	// memory.peak exists from Linux 5.19 on.
	if v, err := readInt(filepath.Join(dir, "memory.peak")); err == nil {
		s.MemoryMax = v
	}
	if s.MemoryLimit, err = readInt(filepath.Join(dir, "memory.max")); err != nil {
		return err
	}
	if s.PidsCurrent, err = readInt(filepath.Join(dir, "pids.current")); err != nil {
		return err
	}
	if kv, err := readKV(filepath.Join(dir, "pids.events")); err == nil {
		s.PidsRefused = kv["max"]
	}
	ev, err := readKV(filepath.Join(dir, "memory.events"))
	if err != nil {
		return err
	}
	s.OOMKills = ev["oom_kill"]
	return nil
}

func (r *Runtime) diskStats(id string, s *runtime.Stats) error {
	fi, err := os.Stat(r.image(id))
	if err != nil {
		return err
	}
	s.DiskBytes = fi.Size()
	var st unix.Statfs_t
	if err := unix.Statfs(r.diskDir(id), &st); err != nil {
		return err
	}
	if st.Type != unix.EXT4_SUPER_MAGIC {
		return fmt.Errorf("disk of sandbox %s is not mounted", id)
	}
	s.DiskUsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
	return nil
}

// readInt reads a cgroup file holding one number; "max" reads as 0
// (no limit).
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		// v1 may print unlimited as an unsigned value past int64.
		if u, uerr := strconv.ParseUint(v, 10, 64); uerr == nil && u > 1<<62 {
			return 1 << 62, nil
		}
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// readKV reads a flat-keyed cgroup file ("key value" per line).
func readKV(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}
