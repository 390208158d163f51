package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/template"
)

// Snapshots.
//
// A snapshot is a running sandbox's writable layer frozen into a read-only
// layer (owners moved to the canonical range, like a template's), plus
// what a new sandbox made from it gets: template, isolation, limits,
// environment, labels, user, egress policy and allow_sudo (each unless
// the create sets it: a create may turn allow_sudo off explicitly). It stores only what the
// sandbox changed: a sandbox made from it stacks the snapshot's layer on
// the layers the source sat on (the template's, shared), with a fresh
// writable layer of its own on top. Both isolation levels keep files this
// way; the record says so (core.SnapshotFilesystem).
//
// The source keeps running: its processes are frozen (cgroup freezer
// under runc, runsc pause under gVisor) only while its writable layer is
// copied, so the copy is consistent, and thawed right after.
//
// On disk, under Config.SnapshotDir:
//
//	<id>.partial/   a snapshot being written: never used, removed at start
//	<id>/layer/     a complete one, renamed into place, then recorded
//
// A snapshot dir without a record (a daemon killed between the rename and
// the store write, or between the record's removal and the dir's) is
// removed at start. A snapshot is in use while a live sandbox sits on its
// layer, another snapshot does (one taken of such a sandbox), or a create
// from it is under way; removing one in use is refused.

// EventSnapshot is the lifecycle event of a snapshot taken of a sandbox.
const EventSnapshot = "snapshot"

// snapshotRuntime is the runtime's ability to show a running sandbox's
// writable layer and the layers it sits on (runc.Runtime, both levels).
type snapshotRuntime interface {
	UpperDir(id string) (string, error)
	Layers(id string) ([]string, error)
}

// LayerStore freezes, exports and imports snapshot layers
// (template.Store); the Manager finds it on Deps.Templates.
type LayerStore interface {
	FreezeLayer(ctx context.Context, src, dst string) (int64, error)
	ExportLayer(ctx context.Context, dir string, w io.Writer) error
	ImportLayer(ctx context.Context, r io.Reader, dst string) (int64, error)
}

// snapState is the Manager's bookkeeping of snapshots in use by creates
// under way (pins), and the lock that orders removals after them.
type snapState struct {
	mu   sync.Mutex
	pins map[string]int
}

func (s *snapState) unpin(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pins[id]--; s.pins[id] <= 0 {
		delete(s.pins, id)
	}
}

func (m *Manager) snapStore() (core.SnapshotStore, error) {
	ss, ok := m.deps.Store.(core.SnapshotStore)
	if !ok || m.cfg.SnapshotDir == "" {
		return nil, fmt.Errorf("snapshots are not configured on this daemon: %w", errdefs.ErrNotImplemented)
	}
	return ss, nil
}

func (m *Manager) layerStore() (LayerStore, error) {
	ls, ok := m.deps.Templates.(LayerStore)
	if !ok {
		return nil, fmt.Errorf("this daemon's template store cannot hold snapshot layers: %w", errdefs.ErrNotImplemented)
	}
	return ls, nil
}

func (m *Manager) snapshotDir(id string) string   { return filepath.Join(m.cfg.SnapshotDir, id) }
func (m *Manager) snapshotLayer(id string) string { return filepath.Join(m.snapshotDir(id), "layer") }

// snapshotMemoryIn is where a snapshot dir holds its memory image.
func (m *Manager) snapshotMemoryIn(dir string) string { return filepath.Join(dir, "memory") }

// snapshotLayers is what a sandbox made from s mounts, lowest first.
func (m *Manager) snapshotLayers(s core.Snapshot) []string {
	return append(slices.Clone(s.BaseLayers), m.snapshotLayer(s.ID))
}

// checkSnapshotID holds snapshot IDs to the sandbox-ID grammar (they name
// directories).
func checkSnapshotID(id string) error {
	if err := types.ValidSandboxID(id); err != nil {
		return &FieldError{Field: "snapshot", Err: fmt.Errorf("snapshot ID %q: %w", id, errdefs.ErrInvalidArgument)}
	}
	return nil
}

// validSnapshotName: free text a listing shows, bounded.
func validSnapshotName(name string) error {
	if len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return &FieldError{Field: "name", Err: fmt.Errorf("snapshot name: at most 128 printable characters: %w", errdefs.ErrInvalidArgument)}
	}
	return nil
}

// Snapshot takes a snapshot of ready sandbox id (see above). name is
// free text for listings.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (core.Snapshot, error) {
	if err := validSnapshotName(name); err != nil {
		return core.Snapshot{}, err
	}
	return m.snapshot(ctx, id, name, false)
}

func (m *Manager) snapshot(ctx context.Context, id, name string, fork bool) (core.Snapshot, error) {
	ss, err := m.snapStore()
	if err != nil {
		return core.Snapshot{}, err
	}
	ls, err := m.layerStore()
	if err != nil {
		return core.Snapshot{}, err
	}
	e, err := m.liveEntry(ctx, id)
	if err != nil {
		return core.Snapshot{}, err
	}
	if err := e.lock(ctx); err != nil {
		return core.Snapshot{}, err
	}
	defer e.unlock()
	if st := e.state(); e.closed || st != StateReady {
		hint := ""
		if st == StatePaused {
			hint = " (resume it first)"
		}
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: it is %s%s: %w", id, st, hint, errdefs.ErrFailedPrecondition)
	}
	ctx = context.WithoutCancel(ctx)
	rt := m.runtimeOf(e.rec)
	sr, ok := rt.(snapshotRuntime)
	fr, ok2 := rt.(pauser)
	if !ok || !ok2 {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: its runtime cannot show or freeze its writable layer: %w", id, errdefs.ErrNotImplemented)
	}
	mc, memory := rt.(MemoryCopier)
	memory = memory && mc.CopiesMemory()
	layers, err := sr.Layers(id)
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	upper, err := sr.UpperDir(id)
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	rec := core.Snapshot{
		ID: newID(), Name: name, Source: id, Kind: core.SnapshotFilesystem,
		Template: e.rec.Template, Isolation: e.rec.Isolation, Owner: e.rec.Owner,
		CPUMillis: e.rec.CPUMillis, MemoryBytes: e.rec.MemoryBytes, DiskBytes: e.rec.DiskBytes, PidsLimit: e.rec.PidsLimit,
		Env: maps.Clone(e.rec.Env), Labels: maps.Clone(e.rec.Labels), User: e.rec.User,
		AllowSudo: e.rec.AllowSudo, BaseLayers: layers, Fork: fork, Volumes: slices.Clone(e.rec.Volumes),
	}
	if memory {
		rec.Kind, rec.AgentToken = core.SnapshotMemory, e.rec.Token
	}
	if m.deps.Egress != nil {
		p, err := m.deps.Egress.LoadPolicy(id)
		switch {
		case err == nil:
			b, err := json.Marshal(p)
			if err != nil {
				return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: policy: %w", id, err)
			}
			rec.Policy = string(b)
		case !errors.Is(err, errdefs.ErrNotFound):
			return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: policy: %w", id, err)
		}
	}
	if err := os.MkdirAll(m.cfg.SnapshotDir, 0o755); err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	partial := m.snapshotDir(rec.ID) + ".partial"
	if err := os.Mkdir(partial, 0o755); err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(partial) // the error returned says why
		}
	}()
	if memory {
		release, err := m.claimImageRoom(ctx, e, m.cfg.SnapshotDir)
		if err != nil {
			return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
		}
		defer release()
		m.accountMemory(ctx, e)
	}
	start := time.Now()
	if err := fr.Pause(ctx, id); err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: freeze: %w", id, err)
	}
	// The memory image first: saving it flushes the sandbox kernel's
	// file state to the writable layer, which is copied next, so files
	// and memory are of the same instant.
	var size int64
	var ferr error
	if memory {
		ferr = mc.CheckpointLive(ctx, id, m.snapshotMemoryIn(partial))
		if ferr == nil {
			ferr = m.keepSourceCA(id, m.snapshotMemoryIn(partial))
		}
		if ferr == nil {
			size, ferr = template.DirSize(m.snapshotMemoryIn(partial))
		}
	}
	if ferr == nil {
		var n int64
		n, ferr = ls.FreezeLayer(ctx, upper, filepath.Join(partial, "layer"))
		size += n
	}
	frozen := time.Since(start)
	if err := fr.Resume(ctx, id); err != nil {
		// A sandbox that cannot be thawed is of no use to anyone.
		reason := "snapshot: thaw failed: " + err.Error()
		return core.Snapshot{}, errors.Join(ferr, m.failLive(ctx, e, reason))
	}
	if ferr != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, ferr)
	}
	rec.SizeBytes = size
	rec.CreatedAt = time.Now().UTC()
	if err := os.Rename(partial, m.snapshotDir(rec.ID)); err != nil {
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	keep = true
	if err := syncDir(m.cfg.SnapshotDir); err != nil {
		_ = os.RemoveAll(m.snapshotDir(rec.ID)) // not recorded: never used
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	if err := ss.PutSnapshot(ctx, rec); err != nil {
		_ = os.RemoveAll(m.snapshotDir(rec.ID)) // not recorded: never used
		return core.Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	m.event(ctx, id, EventSnapshot, fmt.Sprintf("snapshot %s (%s, %d bytes); processes frozen %d ms while its files were copied", rec.ID, rec.Kind, size, frozen.Milliseconds()))
	m.log.Info("snapshot_taken", "sandbox_id", id, "snapshot_id", rec.ID, "size_bytes", size, "frozen_ms", frozen.Milliseconds())
	return rec, nil
}

// GetSnapshot returns one snapshot.
func (m *Manager) GetSnapshot(ctx context.Context, id string) (core.Snapshot, error) {
	ss, err := m.snapStore()
	if err != nil {
		return core.Snapshot{}, err
	}
	if err := checkSnapshotID(id); err != nil {
		return core.Snapshot{}, err
	}
	return ss.GetSnapshot(ctx, id)
}

// Snapshots lists every snapshot, oldest first.
func (m *Manager) Snapshots(ctx context.Context) ([]core.Snapshot, error) {
	ss, err := m.snapStore()
	if err != nil {
		return nil, err
	}
	return ss.ListSnapshots(ctx)
}

// RemoveSnapshot removes a snapshot no sandbox or snapshot uses.
func (m *Manager) RemoveSnapshot(ctx context.Context, id string) error {
	ss, err := m.snapStore()
	if err != nil {
		return err
	}
	if err := checkSnapshotID(id); err != nil {
		return err
	}
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	rec, err := ss.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	if users := m.snapshotUsersLocked(ctx, rec); len(users) > 0 {
		return fmt.Errorf("snapshot %s is in use by %s: destroy those first: %w", id, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	return m.dropSnapshot(ctx, ss, id)
}

// dropSnapshot forgets a snapshot, then removes its files: a crash in
// between leaves a dir without a record, which the next start removes.
func (m *Manager) dropSnapshot(ctx context.Context, ss core.SnapshotStore, id string) error {
	if err := ss.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(m.snapshotDir(id)); err != nil {
		return fmt.Errorf("remove snapshot %s: %w", id, err)
	}
	m.log.Info("snapshot_removed", "snapshot_id", id)
	return nil
}

// snapshotUsersLocked names what uses snapshot rec: creates under way,
// live sandboxes sitting on its layer, and snapshots taken of those. The
// caller holds m.snaps.mu.
func (m *Manager) snapshotUsersLocked(ctx context.Context, rec core.Snapshot) []string {
	var users []string
	if m.snaps.pins[rec.ID] > 0 {
		users = append(users, fmt.Sprintf("%d create(s) under way", m.snaps.pins[rec.ID]))
	}
	layer := m.snapshotLayer(rec.ID)
	m.mu.Lock()
	live := make([]*entry, 0, len(m.live))
	for _, e := range m.live {
		live = append(live, e)
	}
	m.mu.Unlock()
	for _, e := range live {
		st := e.cur.Load()
		if st.closed {
			continue
		}
		sr, ok := m.runtimeOf(st.rec).(snapshotRuntime)
		if !ok {
			continue
		}
		if layers, err := sr.Layers(e.id); err == nil && slices.Contains(layers, layer) {
			users = append(users, "sandbox "+e.id)
		}
	}
	if ss, err := m.snapStore(); err == nil {
		all, _ := ss.ListSnapshots(ctx)
		for _, s := range all {
			if s.ID != rec.ID && slices.Contains(s.BaseLayers, layer) {
				users = append(users, "snapshot "+s.ID)
			}
		}
	}
	slices.Sort(users)
	return users
}

// gcForkSnapshots removes the snapshots forks made once nothing uses
// them (their copies are gone).
func (m *Manager) gcForkSnapshots(ctx context.Context) {
	ss, err := m.snapStore()
	if err != nil {
		return
	}
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	all, err := ss.ListSnapshots(ctx)
	if err != nil {
		m.log.Warn("gc_fork_snapshots", "err", err)
		return
	}
	for _, s := range all {
		if !s.Fork || len(m.snapshotUsersLocked(ctx, s)) > 0 {
			continue
		}
		if err := m.dropSnapshot(ctx, ss, s.ID); err != nil {
			m.log.Warn("gc_fork_snapshots", "snapshot_id", s.ID, "err", err)
		}
	}
}

// reconcileSnapshots removes what a daemon killed mid-snapshot left: dirs
// being written (.partial) and dirs without a record; and fork snapshots
// nothing uses any more. It runs once the live sandboxes are adopted.
func (m *Manager) reconcileSnapshots(ctx context.Context) {
	ss, err := m.snapStore()
	if err != nil {
		return
	}
	ents, err := os.ReadDir(m.cfg.SnapshotDir)
	if err != nil {
		return // none yet
	}
	for _, d := range ents {
		name := d.Name()
		if _, err := ss.GetSnapshot(ctx, name); err == nil {
			continue
		} else if !errors.Is(err, errdefs.ErrNotFound) && types.ValidSandboxID(name) == nil {
			m.log.Warn("reconcile_snapshots", "snapshot_id", name, "err", err)
			continue
		}
		m.log.Warn("remove_orphan", "layer", "snapshot", "path", name)
		if err := os.RemoveAll(filepath.Join(m.cfg.SnapshotDir, name)); err != nil {
			m.log.Error("remove_orphan", "path", name, "err", err)
		}
	}
	m.gcForkSnapshots(ctx)
}

// fromSnapshot fills a create request from its snapshot: the layers to
// stack, and everything the request leaves unset; for a memory snapshot
// also what the sandbox starts from instead of booting. It pins the
// snapshot until the returned func is called (the create is over).
func (m *Manager) fromSnapshot(ctx context.Context, req *CreateRequest) (func(), *memoryStart, error) {
	if req.Snapshot == "" {
		return func() {}, nil, nil
	}
	ss, err := m.snapStore()
	if err != nil {
		return nil, nil, &FieldError{Field: "snapshot", Err: err}
	}
	if err := checkSnapshotID(req.Snapshot); err != nil {
		return nil, nil, err
	}
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	s, err := ss.GetSnapshot(ctx, req.Snapshot)
	if err != nil {
		return nil, nil, &FieldError{Field: "snapshot", Err: err}
	}
	if req.Template != "" && req.Template != s.Template {
		return nil, nil, &FieldError{Field: "template", Err: fmt.Errorf("template %q: snapshot %s is of template %q; leave template unset: %w", req.Template, s.ID, s.Template, errdefs.ErrInvalidArgument)}
	}
	layers := m.snapshotLayers(s)
	for _, l := range layers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return nil, nil, &FieldError{Field: "snapshot", Err: fmt.Errorf("snapshot %s: layer %s is gone (its template was removed or rebuilt?): %w", s.ID, l, errdefs.ErrFailedPrecondition)}
		}
	}
	var restore *memoryStart
	if s.Kind == core.SnapshotMemory {
		if restore, err = m.memoryStartOf(s, req); err != nil {
			return nil, nil, err
		}
	}
	if err := snapshotVolumes(s, req); err != nil {
		return nil, nil, err
	}
	req.Template, req.Layers = s.Template, layers
	if req.Isolation == "" {
		req.Isolation = s.Isolation
	}
	fill := func(v *int64, from int64) {
		if *v == 0 {
			*v = from
		}
	}
	fill(&req.Limits.CPUMillis, s.CPUMillis)
	fill(&req.Limits.MemoryBytes, s.MemoryBytes)
	fill(&req.Limits.DiskBytes, s.DiskBytes)
	fill(&req.Limits.PidsLimit, s.PidsLimit)
	req.Env = merged(s.Env, req.Env)
	req.Labels = merged(s.Labels, req.Labels)
	if req.User == "" {
		req.User = s.User
	}
	if req.AllowSudo == nil {
		req.AllowSudo = new(s.AllowSudo)
	}
	if req.Network == nil && s.Policy != "" {
		var p policy.Policy
		if err := json.Unmarshal([]byte(s.Policy), &p); err != nil {
			return nil, nil, fmt.Errorf("snapshot %s: policy: %w", s.ID, err)
		}
		req.Network = &p
	}
	id := s.ID
	if m.snaps.pins == nil {
		m.snaps.pins = map[string]int{}
	}
	m.snaps.pins[id]++
	return func() { m.snaps.unpin(id) }, restore, nil
}

// merged is base overlaid with over (over wins), never nil.
func merged(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}

// accountMemory has the sandbox kernel of gVisor sandbox e take stock of
// the memory its processes committed, right before a save of its memory
// that leaves it running (a snapshot, a fork; a pause's quiesce has the
// agent do the same, see the agent's quiesce.go): reading its
// /proc/meminfo, through the agent, makes the sentry look up which pages
// of its memory file are there (mincore, 2–4 ms for 272 MiB here). A page
// it has not taken stock of, the save reads instead, one at a time, to
// skip the zero ones; so a sandbox's first save, all of whose pages its
// processes touched since it started, took 0.4–0.6 s for 272 MiB against
// 0.2–0.3 s for one whose pages the sentry knew (README, pause section).
// Best effort: a failure costs that time and nothing else.
func (m *Manager) accountMemory(ctx context.Context, e *entry) {
	if m.deps.Files == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, accountMemoryWait)
	defer cancel()
	if _, err := m.deps.Files.ReadFile(ctx, agentAddr(e.att), e.rec.Token, "/proc/meminfo", 64<<10); err != nil {
		m.log.Debug("account_memory", "sandbox_id", e.id, "err", err)
	}
}

// accountMemoryWait bounds accountMemory: past it, the save finds the
// pages itself, as it did before.
const accountMemoryWait = 2 * time.Second
