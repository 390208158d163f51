package agent

import (
	"bufio"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/meminfo"
)

// cpuSampler remembers the previous /proc/stat reading so each /metrics call
// reports usage since the one before (the first, since boot).
type cpuSampler struct {
	mu          sync.Mutex
	busy, total uint64
}

func (c *cpuSampler) usedPct() float64 {
	busy, total, ok := readCPU()
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	db, dt := busy-c.busy, total-c.total
	c.busy, c.total = busy, total
	if dt == 0 || busy < db {
		return 0
	}
	return math.Round(float64(db)/float64(dt)*10000) / 100
}

func readCPU() (busy, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range fields[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, true
}

func readMem() (used, total uint64) {
	info, err := meminfo.Read()
	if err != nil {
		return 0, 0
	}
	total = uint64(info.Total)
	avail := uint64(info.Available)
	if avail > total {
		return 0, total
	}
	return total - avail, total
}

// metricsBody is envd's /metrics answer.
type metricsBody struct {
	Timestamp  int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	m := metricsBody{
		Timestamp:  time.Now().UTC().Unix(),
		CPUCount:   runtime.NumCPU(),
		CPUUsedPct: s.cpu.usedPct(),
	}
	m.MemUsed, m.MemTotal = readMem()
	var st unix.Statfs_t
	if err := unix.Statfs(s.cfg.DiskPath, &st); err == nil {
		bs := uint64(st.Bsize)
		m.DiskTotal = st.Blocks * bs
		m.DiskUsed = (st.Blocks - st.Bfree) * bs
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

func (s *Server) envs(w http.ResponseWriter, _ *http.Request) {
	out := map[string]string{}
	for _, kv := range s.environ() {
		k, v, _ := cutEnv(kv)
		out[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
