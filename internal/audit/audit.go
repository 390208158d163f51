// Package audit keeps the host-side record of every egress decision: one
// JSONL file per sandbox under the daemon's data dir, rotated by size,
// readable and followable. Nothing inside a sandbox can reach these files;
// they outlive the sandbox so its record can still be read and exported.
// The sandbox decides how much it is audited, so repeats are aggregated,
// each sandbox's records are rate-limited into counted summaries
// (limit.go), and rotation keeps the earliest records and every denial
// (files.go): a flood can neither grow the log without bound nor flush
// its evidence away.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
)

// Record is one decision.
type Record struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	// Proto is dns, tcp, tls or http.
	Proto string `json:"proto"`
	// Name is the destination name (SNI, Host, DNS question), if any.
	Name   string `json:"name,omitempty"`
	IP     string `json:"ip,omitempty"`
	Port   uint16 `json:"port,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Decision is "allow" or "deny".
	Decision string `json:"decision"`
	Rule     string `json:"rule"`
	// Reason adds detail to a denial (forbidden address, Host≠SNI, …).
	Reason   string `json:"reason,omitempty"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
	// Count, when set, is how many decisions this one record stands for:
	// repeats of an identical decision (aggregated), the firewall's
	// refusals to one destination, or decisions over the rate limit
	// (Proto "audit", Rule "rate-limit"), from Time to Last.
	Count int64     `json:"count,omitempty"`
	Last  time.Time `json:"last,omitzero"`
}

// Denied reports whether the record is a denial.
func (r Record) Denied() bool { return r.Decision != "allow" }

// Config configures a Log.
type Config struct {
	// Dir holds <sandbox>.jsonl and its rotations <sandbox>.jsonl.1 ….
	Dir string
	// MaxBytes rotates a file once it grows past this (default 16 MiB).
	MaxBytes int64
	// Keep is how many rotated files to keep (default 3).
	Keep int
	// Rate and Burst bound the records one sandbox writes per second
	// (default 100, burst 2000); Window is how long repeats of one
	// decision are aggregated (default 10 s). See limit.go.
	Rate   float64
	Burst  int
	Window time.Duration
	// HeadBytes of a sandbox's earliest records and every denial are kept
	// when their file rotates away, in up to KeptBytes (defaults 1 MiB and
	// 64 MiB): the log is evidence.
	HeadBytes int64
	KeptBytes int64
	Logger    *slog.Logger
	// OnAppend, when set, sees every record handed to Append, before
	// aggregation and rate limiting (metrics count decisions with it).
	OnAppend func(Record)
}

// Log appends and reads audit records.
type Log struct {
	cfg Config
	log *slog.Logger

	files *Files

	// mu orders appends with followers' reads, so a follower misses no
	// record and sees none twice.
	mu    sync.Mutex
	subs  map[string]map[chan struct{}]bool
	gates map[string]*gate
	now   func() time.Time
}

// New opens the audit log in cfg.Dir (created 0700).
func New(cfg Config) (*Log, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 16 << 20
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 3
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 100
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 2000
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.HeadBytes <= 0 {
		cfg.HeadBytes = 1 << 20
	}
	if cfg.KeptBytes <= 0 {
		cfg.KeptBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	files, err := NewFiles(cfg.Dir, cfg.MaxBytes, cfg.Keep)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	files.Retain(Retention{HeadBytes: cfg.HeadBytes, MaxBytes: cfg.KeptBytes, Keep: deniedLine})
	return &Log{cfg: cfg, log: cfg.Logger, files: files, subs: map[string]map[chan struct{}]bool{}, gates: map[string]*gate{}, now: time.Now}, nil
}

// deniedLine reports whether a JSONL line records a denial (what rotation
// must keep).
func deniedLine(line []byte) bool {
	var r struct {
		Decision string `json:"decision"`
	}
	return json.Unmarshal(line, &r) == nil && r.Decision != "allow"
}

func (l *Log) path(id string) string { return l.files.Path(id) }

// Append records r in its sandbox's file, or counts it into an aggregate
// or a rate-limit summary (limit.go). It never fails the caller's
// connection: errors are logged.
func (l *Log) Append(r Record) {
	if types.ValidSandboxID(r.Sandbox) != nil {
		return
	}
	if r.Time.IsZero() {
		r.Time = l.now()
	}
	r.Time = r.Time.UTC()
	if l.cfg.OnAppend != nil {
		l.cfg.OnAppend(r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.admit(r) {
		l.write(r)
	}
}

// write appends one record (under l.mu) and wakes followers.
func (l *Log) write(r Record) {
	r.Time = r.Time.UTC()
	if !r.Last.IsZero() {
		r.Last = r.Last.UTC()
	}
	line, err := json.Marshal(r)
	if err != nil {
		return
	}
	line = append(line, '\n')
	if err := l.files.Append(r.Sandbox, line); err != nil {
		l.log.Error("audit_append_failed", "sandbox_id", r.Sandbox, "err", err)
	}
	for ch := range l.subs[r.Sandbox] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Close writes the sandbox's pending summaries and closes its file (it
// stays on disk).
func (l *Log) Close(id string) {
	l.mu.Lock()
	l.forget(id)
	l.mu.Unlock()
	l.files.Close(id)
}

// CloseAll writes every pending summary and closes every file.
func (l *Log) CloseAll() {
	l.mu.Lock()
	for id := range l.gates {
		l.forget(id)
	}
	l.mu.Unlock()
	l.files.CloseAll()
}

// Filter selects records.
type Filter struct {
	DeniedOnly bool
	// Since, when set, keeps records from that time on.
	Since time.Time
}

func (f Filter) match(r Record) bool {
	return (!f.DeniedOnly || r.Denied()) && (f.Since.IsZero() || !r.Time.Before(f.Since))
}

// Read returns the sandbox's records, oldest first, including rotated
// files. An unknown sandbox has no records (not an error).
func (l *Log) Read(id string, f Filter) ([]Record, error) {
	if err := types.ValidSandboxID(id); err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.flush(id, true)
	l.mu.Unlock()
	return l.read(id, f)
}

func (l *Log) read(id string, f Filter) ([]Record, error) {
	var out []Record
	for _, p := range l.files.Paths(id) {
		recs, _, err := readFrom(p, 0)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if f.match(r) {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// readFrom decodes whole lines of path from offset and returns the offset
// after the last whole line.
func readFrom(path string, off int64) ([]Record, int64, error) {
	var out []Record
	next, err := ReadLines(path, off, func(line []byte) {
		var r Record
		if json.Unmarshal(line, &r) == nil {
			out = append(out, r)
		}
	})
	return out, next, err
}

// Follow calls fn for every record (history first, then new ones as they
// are appended) until ctx ends or fn fails.
func (l *Log) Follow(ctx context.Context, id string, f Filter, fn func(Record) error) error {
	if err := types.ValidSandboxID(id); err != nil {
		return err
	}
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.subs[id] == nil {
		l.subs[id] = map[chan struct{}]bool{}
	}
	l.subs[id][ch] = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.subs[id], ch)
		if len(l.subs[id]) == 0 {
			delete(l.subs, id)
		}
		l.mu.Unlock()
	}()
	// History and the offset to follow from are taken under the lock
	// Append holds, so no record is missed or seen twice.
	l.mu.Lock()
	l.flush(id, true)
	hist, err := l.read(id, f)
	off := int64(0)
	if fi, serr := os.Stat(l.path(id)); serr == nil {
		off = fi.Size()
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	for _, r := range hist {
		if err := fn(r); err != nil {
			return err
		}
	}
	// Appends signal ch; a slow tick also catches a rotation.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		case <-tick.C:
		}
		l.mu.Lock()
		l.flush(id, false)
		if fi, err := os.Stat(l.path(id)); err == nil && fi.Size() < off {
			off = 0 // rotated: the new file starts over
		}
		recs, next, err := readFrom(l.path(id), off)
		l.mu.Unlock()
		if err != nil {
			return err
		}
		off = next
		for _, r := range recs {
			if f.match(r) {
				if err := fn(r); err != nil {
					return err
				}
			}
		}
	}
}

// Remove deletes a sandbox's audit files.
func (l *Log) Remove(id string) error {
	l.mu.Lock()
	l.forget(id)
	l.mu.Unlock()
	return l.files.Remove(id)
}
