// Package meminfo reads the kernel's memory summary, /proc/meminfo: the
// host's (the node's capacity, the benchmarks' baselines) and, inside a
// sandbox, the sandbox kernel's (the agent's metrics). It links nothing
// but the standard library, so the agent may use it.
package meminfo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Info holds the fields Berth reads, in bytes.
type Info struct {
	Total int64
	// Available is MemAvailable; 0 when the kernel does not report it.
	Available int64
	// Anon and Shmem are AnonPages and Shmem: the memory processes hold
	// (their own pages, and shared memory such as a gVisor sentry's
	// memory file). Unlike MemAvailable, they drop as soon as a process
	// lets go, while the pages it freed may sit on the kernel's per-CPU
	// lists, outside MemFree, for seconds.
	Anon, Shmem int64
}

// Read parses /proc/meminfo.
func Read() (Info, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	info, err := Parse(f)
	if err != nil {
		return Info{}, fmt.Errorf("/proc/meminfo: %w", err)
	}
	return info, nil
}

// ErrNoTotal means the text has no MemTotal line.
var ErrNoTotal = errors.New("no MemTotal line")

// Parse reads meminfo's "Name: N kB" lines. A field Berth reads with a
// malformed value, or no MemTotal at all, is an error.
func Parse(r io.Reader) (Info, error) {
	var info Info
	seen := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		var dst *int64
		switch {
		case !ok:
			continue
		case name == "MemTotal":
			dst, seen = &info.Total, true
		case name == "MemAvailable":
			dst = &info.Available
		case name == "AnonPages":
			dst = &info.Anon
		case name == "Shmem":
			dst = &info.Shmem
		default:
			continue
		}
		num, unit, _ := strings.Cut(strings.TrimSpace(rest), " ")
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 || n > 1<<53 || (unit != "" && unit != "kB") {
			return Info{}, fmt.Errorf("%s: bad value %q", name, strings.TrimSpace(rest))
		}
		*dst = n << 10
	}
	if err := sc.Err(); err != nil {
		return Info{}, err
	}
	if !seen {
		return Info{}, ErrNoTotal
	}
	return info, nil
}
