package usage

import (
	goruntime "runtime"
	"strconv"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

func sampleAt(id string, at time.Time, cpu time.Duration, mem int64) sandbox.UsageSample {
	return sandbox.UsageSample{ID: id, Time: at, Stats: runtime.Stats{CPUUsage: cpu, MemoryBytes: mem, MemoryLimit: 1 << 30, DiskUsedBytes: 7, DiskBytes: 1 << 30}}
}

// TestHistoryInterval: of the monitor's samples (one a second, jittered),
// one per interval becomes a point.
func TestHistoryInterval(t *testing.T) {
	h := NewHistory(5*time.Second, 0)
	t0 := time.Unix(1_800_000_000, 0)
	sb := sandbox.Sandbox{Sandbox: core.Sandbox{ID: "a", CPUMillis: 2000, CreatedAt: t0}}
	for i := 1; i <= 20; i++ {
		jitter := time.Duration(i%3-1) * 30 * time.Millisecond
		h.Observe(sampleAt("a", t0.Add(time.Duration(i)*time.Second+jitter), time.Duration(i)*time.Second, int64(i)))
	}
	ms := h.Series(sb, time.Time{}, t0.Add(time.Minute), t0.Add(time.Minute))
	if len(ms) != 4 {
		t.Fatalf("20 s of samples made %d points, want 4: %+v", len(ms), ms)
	}
	for i, m := range ms {
		if m.MemoryBytes != int64(1+5*i) {
			t.Errorf("point %d holds the sample of second %d, want %d", i, m.MemoryBytes, 1+5*i)
		}
		// One CPU-second per second of two CPUs: 50 %, the first point's
		// since the sandbox started.
		if m.CPUs != 2 || m.CPUPercent < 49 || m.CPUPercent > 51 || m.MemoryLimitBytes != 1<<30 || m.DiskUsedBytes != 7 {
			t.Errorf("point %d = %+v", i, m)
		}
	}
}

// TestHistoryCoarsens: a full series drops every other point, keeps its
// newest, and spaces later points twice as far: the whole life stays
// covered in bounded memory.
func TestHistoryCoarsens(t *testing.T) {
	h := NewHistory(time.Second, 8)
	t0 := time.Unix(1_800_000_000, 0)
	sb := sandbox.Sandbox{Sandbox: core.Sandbox{ID: "a", CPUMillis: 1000, CreatedAt: t0}}
	for i := range 100 {
		h.Observe(sampleAt("a", t0.Add(time.Duration(i)*time.Second), 0, int64(i)))
	}
	ms := h.Series(sb, time.Time{}, t0.Add(time.Hour), t0.Add(time.Hour))
	if len(ms) > 8 || len(ms) < 4 {
		t.Fatalf("%d points, want 4 to 8", len(ms))
	}
	if ms[0].MemoryBytes > 16 || ms[len(ms)-1].MemoryBytes < 84 {
		t.Errorf("points span seconds %d to %d of 0 to 99", ms[0].MemoryBytes, ms[len(ms)-1].MemoryBytes)
	}
	for i := 1; i < len(ms); i++ {
		if !ms[i].Time.After(ms[i-1].Time) {
			t.Errorf("point %d at %v is not after %v", i, ms[i].Time, ms[i-1].Time)
		}
	}
	if se := h.by["a"]; cap(se.pts) > 2*8 {
		t.Errorf("series capacity %d", cap(se.pts))
	}
}

// TestHistoryRange: points in [since, until]; each point's CPU share is
// over the time since the point before, also one outside the range; an
// open end adds a reading taken now from the sandbox's usage, a closed
// one does not.
func TestHistoryRange(t *testing.T) {
	h := NewHistory(5*time.Second, 0)
	t0 := time.Unix(1_800_000_000, 0)
	h.Observe(sampleAt("a", t0.Add(5*time.Second), 0, 1))
	h.Observe(sampleAt("a", t0.Add(10*time.Second), 5*time.Second, 2)) // all of its one CPU
	h.Observe(sampleAt("a", t0.Add(15*time.Second), 5*time.Second, 3)) // idle
	h.Observe(sampleAt("other", t0.Add(15*time.Second), 0, 99))
	now := t0.Add(17 * time.Second)
	sb := sandbox.Sandbox{Sandbox: core.Sandbox{ID: "a", CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 2 << 30, CreatedAt: t0},
		Usage: &runtime.Stats{CPUUsage: 6 * time.Second, MemoryBytes: 4}}
	ms := h.Series(sb, t0.Add(10*time.Second), t0.Add(10*time.Second), now)
	if len(ms) != 1 || ms[0].MemoryBytes != 2 || ms[0].CPUPercent != 100 {
		t.Errorf("[10 s, 10 s] = %+v", ms)
	}
	ms = h.Series(sb, t0.Add(11*time.Second), time.Time{}, now)
	if len(ms) != 2 || ms[0].MemoryBytes != 3 || ms[0].CPUPercent != 0 {
		t.Fatalf("[11 s, …) = %+v", ms)
	}
	live := ms[1]
	if !live.Time.Equal(now) || live.MemoryBytes != 4 || live.CPUPercent != 50 || live.MemoryLimitBytes != 1<<30 || live.DiskBytes != 2<<30 {
		t.Errorf("reading taken now = %+v", live)
	}
	if ms := h.Series(sb, t0.Add(time.Hour), time.Time{}, now); len(ms) != 0 {
		t.Errorf("a range starting after now = %+v", ms)
	}
	// Without a CPU limit the share is of the host's CPUs.
	sb.CPUMillis = 0
	if ms := h.Series(sb, t0.Add(10*time.Second), t0.Add(10*time.Second), now); len(ms) != 1 || ms[0].CPUs != float64(goruntime.NumCPU()) {
		t.Errorf("unlimited = %+v", ms)
	}
	// A paused sandbox (no usage) keeps its points and adds none now.
	sb.Usage = nil
	if ms := h.Series(sb, time.Time{}, time.Time{}, now); len(ms) != 3 {
		t.Errorf("paused = %+v", ms)
	}
}

// TestHistoryForgets: a final sample forgets the sandbox; Retain forgets
// those not live, but not one whose point came after the list was taken.
func TestHistoryForgets(t *testing.T) {
	h := NewHistory(5*time.Second, 0)
	t0 := time.Unix(1_800_000_000, 0)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.Observe(sampleAt(id, t0, 0, 1))
	}
	final := sampleAt("a", t0.Add(time.Second), 0, 1)
	final.Final = true
	h.Observe(final)
	h.Observe(sampleAt("d", t0.Add(10*time.Second), 0, 1))
	h.Retain(map[string]bool{"b": true}, t0.Add(5*time.Second))
	for id, want := range map[string]bool{"a": false, "b": true, "c": false, "d": true} {
		if _, ok := h.by[id]; ok != want {
			t.Errorf("%s kept %v, want %v", id, ok, want)
		}
	}
}

// TestTee: every sink sees every sample.
func TestTee(t *testing.T) {
	a, b := NewHistory(time.Second, 0), NewHistory(time.Second, 0)
	Tee{a, b}.Observe(sampleAt("x", time.Unix(1, 0), 0, 1))
	if len(a.by["x"].pts) != 1 || len(b.by["x"].pts) != 1 {
		t.Error("a sink missed the sample")
	}
}

// BenchmarkHistoryObserve is one monitor sample handed to a History of
// 1,000 sandboxes with full series (the daemon's cost per sandbox per
// second); it reports the heap the full series hold per sandbox.
func BenchmarkHistoryObserve(b *testing.B) {
	const sandboxes = 1000
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	h := NewHistory(time.Second, 0)
	t0 := time.Unix(1_800_000_000, 0)
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = "sb" + strconv.Itoa(i)
		for j := range DefaultHistoryPoints {
			h.Observe(sampleAt(ids[i], t0.Add(time.Duration(j)*time.Second), 0, 1))
		}
	}
	goruntime.GC()
	goruntime.ReadMemStats(&after)
	at := t0.Add(time.Duration(DefaultHistoryPoints) * time.Second)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		h.Observe(sampleAt(ids[i%sandboxes], at.Add(time.Duration(i/sandboxes)*time.Second), 0, 1))
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/sandboxes, "heap-B/sandbox")
}
