package usage

import (
	"math"
	goruntime "runtime"
	"sort"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// DefaultHistoryInterval is the spacing of a young sandbox's metrics
// points, as E2B samples.
const DefaultHistoryInterval = 5 * time.Second

// DefaultHistoryPoints bounds one sandbox's series: 720 points of 48
// bytes, the first hour at 5 s: about 40 KiB of heap per sandbox with
// the slice's spare room (BenchmarkHistoryObserve).
const DefaultHistoryPoints = 720

// History keeps the usage of each sandbox over its life, for the metrics
// APIs (the native GET /v1/sandboxes/{id}/metrics, E2B's getMetrics, and
// through them the Kubernetes gateway's). It is fed the Manager's monitor
// samples beside the Meter and keeps one point per interval. A series
// that reaches its bound drops every other point and doubles its spacing,
// so it covers the whole life of a sandbox in bounded memory at a
// resolution that coarsens with age (the first hour at 5 s, the next two
// at 10 s, …). A paused sandbox keeps its series; an ended one is
// forgotten. It lives in memory: a daemon restart starts every series
// anew.
type History struct {
	interval time.Duration
	max      int

	mu sync.Mutex
	by map[string]*series
}

type series struct {
	every time.Duration
	pts   []point
}

// point is one reading, 48 bytes.
type point struct {
	at        int64 // unix nanoseconds
	cpu       time.Duration
	mem       int64
	memLimit  int64
	disk      int64
	diskBytes int64
}

// NewHistory returns a History keeping a point per interval and at most
// maxPoints per sandbox (the defaults if zero).
func NewHistory(interval time.Duration, maxPoints int) *History {
	if interval <= 0 {
		interval = DefaultHistoryInterval
	}
	if maxPoints < 2 {
		maxPoints = DefaultHistoryPoints
	}
	return &History{interval: interval, max: maxPoints, by: map[string]*series{}}
}

// Observe takes a monitor sample: a point if the sandbox's last one is an
// interval old (a tenth of it early is on time: the monitor's ticks
// jitter), nothing otherwise; a final sample forgets the sandbox.
func (h *History) Observe(s sandbox.UsageSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.Final {
		delete(h.by, s.ID)
		return
	}
	p := point{at: s.Time.UnixNano(), cpu: s.Stats.CPUUsage, mem: s.Stats.MemoryBytes, memLimit: s.Stats.MemoryLimit,
		disk: s.Stats.DiskUsedBytes, diskBytes: s.Stats.DiskBytes}
	se := h.by[s.ID]
	if se == nil {
		se = &series{every: h.interval}
		h.by[s.ID] = se
	}
	if n := len(se.pts); n > 0 && p.at-se.pts[n-1].at < int64(se.every-se.every/10) {
		return
	}
	se.pts = append(se.pts, p)
	if len(se.pts) > h.max {
		// Keep the newest point and every other one before it.
		kept := se.pts[:0]
		for i := (len(se.pts) - 1) % 2; i < len(se.pts); i += 2 {
			kept = append(kept, se.pts[i])
		}
		se.pts = kept
		se.every *= 2
	}
}

// Retain forgets every sandbox live, a list of the live sandboxes taken
// at listed, does not hold: one that ended without a final sample (its
// cgroup was gone first). A series with a point taken after listed is
// kept (its sandbox was created meanwhile).
func (h *History) Retain(live map[string]bool, listed time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, se := range h.by {
		if !live[id] && (len(se.pts) == 0 || se.pts[len(se.pts)-1].at < listed.UnixNano()) {
			delete(h.by, id)
		}
	}
}

// Series returns sb's points taken in [since, until], oldest first; a
// zero bound is open. A range open at its end also ends with a reading
// taken now, from sb's usage as the Manager reported it (a sandbox
// younger than one interval has no point yet). Each point's CPU share is
// over the time since the point before it (the first: since sb started),
// as a percentage of sb's CPU limit, or of the host's CPUs without one.
func (h *History) Series(sb sandbox.Sandbox, since, until, now time.Time) []types.MetricSample {
	cpus := float64(sb.CPUMillis) / 1000
	if cpus <= 0 {
		cpus = float64(goruntime.NumCPU())
	}
	from, to := int64(math.MinInt64), int64(math.MaxInt64)
	if !since.IsZero() {
		from = since.UnixNano()
	}
	if !until.IsZero() {
		to = until.UnixNano()
	}
	out := []types.MetricSample{}
	prev := point{at: sb.CreatedAt.UnixNano()}
	h.mu.Lock()
	if se := h.by[sb.ID]; se != nil {
		// The points are in time order: only the range's are read.
		pts := se.pts
		i := sort.Search(len(pts), func(k int) bool { return pts[k].at >= from })
		if i > 0 {
			prev = pts[i-1]
		}
		for _, p := range pts[i:] {
			if p.at > to {
				break
			}
			out = append(out, p.sample(prev, cpus))
			prev = p
		}
		if n := len(pts); n > 0 {
			prev = pts[n-1] // a reading now is over the time since the last point
		}
	}
	h.mu.Unlock()
	in := func(at int64) bool { return at >= from && at <= to }
	if until.IsZero() && sb.Usage != nil && in(now.UnixNano()) && now.UnixNano() > prev.at {
		u := sb.Usage
		cur := point{at: now.UnixNano(), cpu: u.CPUUsage, mem: u.MemoryBytes, memLimit: u.MemoryLimit, disk: u.DiskUsedBytes, diskBytes: u.DiskBytes}
		if cur.memLimit == 0 {
			cur.memLimit = sb.MemoryBytes
		}
		if cur.diskBytes == 0 {
			cur.diskBytes = sb.DiskBytes
		}
		out = append(out, cur.sample(prev, cpus))
	}
	return out
}

// sample is p as the API shows it, its CPU share over the time since prev.
func (p point) sample(prev point, cpus float64) types.MetricSample {
	s := types.MetricSample{
		Time: time.Unix(0, p.at).UTC(), CPUs: cpus, CPUSeconds: p.cpu.Seconds(),
		MemoryBytes: p.mem, MemoryLimitBytes: p.memLimit, DiskUsedBytes: p.disk, DiskBytes: p.diskBytes,
	}
	if wall := time.Duration(p.at - prev.at); wall > 0 {
		s.CPUPercent = min(100, max(0, 100*(p.cpu-prev.cpu).Seconds()/wall.Seconds()/cpus))
	}
	return s
}

// Tee hands each sample to every sink in turn (the Meter and the
// History).
type Tee []sandbox.UsageSink

// Observe implements sandbox.UsageSink.
func (t Tee) Observe(s sandbox.UsageSample) {
	for _, sink := range t {
		sink.Observe(s)
	}
}
