package agent

import (
	"bytes"
	"os"
	"strconv"
	"testing"
)

// TestReserveThreads: the process holds more threads than asked for once
// ReserveThreads returns, after the goroutines that made them have ended
// (the runtime keeps idle threads).
func TestReserveThreads(t *testing.T) {
	before := threadCount()
	if before == 0 {
		t.Fatal("no thread count in /proc/self/status")
	}
	n := before + 16
	ReserveThreads(n)
	if got := threadCount(); got <= n {
		t.Fatalf("threads after ReserveThreads(%d) = %d (before: %d)", n, got, before)
	}
}

// TestReserveFor: 32 threads, or a quarter of a smaller task limit.
func TestReserveFor(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{{16, 4}, {64, 16}, {128, 32}, {1024, 32}, {3, 0}} {
		if got := reserveFor(c.limit); got != c.want {
			t.Errorf("reserveFor(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
}

// threadCount is the process's OS threads (/proc/self/status), 0 when it
// cannot be read.
func threadCount() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Threads:")); ok {
			n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
			return n
		}
	}
	return 0
}
