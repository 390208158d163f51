package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// snapMemStore is memStore with snapshot records.
type snapMemStore struct {
	*memStore
	mu    sync.Mutex
	snaps map[string]core.Snapshot
}

func (s *snapMemStore) PutSnapshot(_ context.Context, sn core.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps[sn.ID] = sn
	return nil
}

func (s *snapMemStore) GetSnapshot(_ context.Context, id string) (core.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok {
		return sn, errdefs.ErrNotFound
	}
	return sn, nil
}

func (s *snapMemStore) ListSnapshots(context.Context) ([]core.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []core.Snapshot
	for _, sn := range s.snaps {
		out = append(out, sn)
	}
	return out, nil
}

func (s *snapMemStore) DeleteSnapshot(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snaps[id]; !ok {
		return errdefs.ErrNotFound
	}
	delete(s.snaps, id)
	return nil
}

// TestSnapshotRecords: at start, a half-written snapshot (.partial) and a
// dir without a record are removed and a recorded one is kept; a create
// from a snapshot takes what it leaves unset from the snapshot and stacks
// its layer; removal is refused while a create from it is under way; an
// unknown snapshot is not found naming snapshot.
func TestSnapshotRecords(t *testing.T) {
	dir := t.TempDir()
	base := t.TempDir()
	st := &snapMemStore{memStore: newMemStore(), snaps: map[string]core.Snapshot{}}
	kept := core.Snapshot{ID: "keptsnap", Kind: core.SnapshotFilesystem, Template: "minimal", Isolation: core.IsolationRunc,
		CPUMillis: 2000, Env: map[string]string{"A": "snap", "B": "snap"}, Labels: map[string]string{"l": "v"}, User: "user",
		Policy: `{"mode":"allow","allow":["example.com"]}`, BaseLayers: []string{base}}
	st.snaps[kept.ID] = kept
	for _, d := range []string{"keptsnap/layer", "halfsnap.partial/layer", "norecord/layer"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m, err := New(Config{AgentPath: "/agent", SnapshotDir: dir, Logger: slog.New(slog.DiscardHandler)},
		Deps{Runtime: &fakeRuntime{running: map[string]runtime.Status{}}, Network: &fakeNet{ids: map[string]bool{}}, Templates: fakeTemplates{}, Store: st, Prober: fakeProber{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"keptsnap"}) {
		t.Errorf("snapshots dir after start = %v; want only the recorded one", names)
	}

	req := CreateRequest{Snapshot: "keptsnap", Env: map[string]string{"B": "req"}}
	unpin, _, err := m.fromSnapshot(t.Context(), &req)
	if err != nil {
		t.Fatalf("fromSnapshot: %v", err)
	}
	wantLayers := []string{base, filepath.Join(dir, "keptsnap", "layer")}
	if req.Template != "minimal" || req.Limits.CPUMillis != 2000 || req.Env["A"] != "snap" || req.Env["B"] != "req" ||
		req.Labels["l"] != "v" || req.User != "user" || req.Network == nil || req.Network.Mode != "allow" || !slices.Equal(req.Layers, wantLayers) {
		t.Errorf("fromSnapshot filled %+v; want the snapshot's settings under the request's, layers %v", req, wantLayers)
	}
	err = m.RemoveSnapshot(t.Context(), "keptsnap")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("RemoveSnapshot while a create uses it = %v; want failed_precondition", err)
	}
	unpin()
	if err := m.RemoveSnapshot(t.Context(), "keptsnap"); err != nil {
		t.Errorf("RemoveSnapshot = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "keptsnap")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot dir after removal: %v; want gone", err)
	}
	req = CreateRequest{Snapshot: "keptsnap"}
	_, _, err = m.fromSnapshot(t.Context(), &req)
	var fe *FieldError
	if !errors.Is(err, errdefs.ErrNotFound) || !errors.As(err, &fe) || fe.Field != "snapshot" {
		t.Errorf("fromSnapshot(removed) = %v; want not found naming snapshot", err)
	}
	req = CreateRequest{Snapshot: "../etc"}
	if _, _, err := m.fromSnapshot(t.Context(), &req); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("fromSnapshot(../etc) = %v; want invalid argument", err)
	}
}

// TestMemorySnapshotRequests: a create from a memory snapshot starts from
// its image with its agent's token, and is refused, naming the field,
// when it asks for what the snapshot's running processes cannot change
// (another isolation level, pids limit, allow_sudo, workdir); a
// runtime that cannot start from an image refuses it naming snapshot.
func TestMemorySnapshotRequests(t *testing.T) {
	dir := t.TempDir()
	base := t.TempDir()
	st := &snapMemStore{memStore: newMemStore(), snaps: map[string]core.Snapshot{}}
	snap := core.Snapshot{ID: "memsnap", Kind: core.SnapshotMemory, Template: "minimal", Isolation: core.IsolationGVisor,
		PidsLimit: 64, User: "user", AllowSudo: true, AgentToken: "parenttoken", BaseLayers: []string{base}}
	st.snaps[snap.ID] = snap
	if err := os.MkdirAll(filepath.Join(dir, "memsnap", "layer"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{AgentPath: "/agent", SnapshotDir: dir, Logger: slog.New(slog.DiscardHandler)},
		Deps{Runtime: &fakeRuntime{running: map[string]runtime.Status{}}, Network: &fakeNet{ids: map[string]bool{}}, Templates: fakeTemplates{}, Store: st, Prober: fakeProber{}})
	if err != nil {
		t.Fatal(err)
	}
	req := CreateRequest{Snapshot: "memsnap", Isolation: core.IsolationGVisor, User: "user", Limits: Limits{PidsLimit: 64}, AllowSudo: new(true)}
	unpin, ms, err := m.fromSnapshot(t.Context(), &req)
	if err != nil {
		t.Fatalf("fromSnapshot naming the snapshot's own settings: %v", err)
	}
	unpin()
	if ms == nil || ms.token != "parenttoken" || ms.image != filepath.Join(dir, "memsnap", "memory") {
		t.Errorf("memory start = %+v; want the snapshot's image and its agent's token", ms)
	}
	if !req.sudo() || req.Limits.PidsLimit != 64 || req.User != "user" {
		t.Errorf("request filled to %+v; want the snapshot's", req)
	}
	for field, r := range map[string]CreateRequest{
		"isolation":  {Isolation: core.IsolationRunc},
		"pids_limit": {Limits: Limits{PidsLimit: 128}},
		"allow_sudo": {AllowSudo: new(false)},
		"workdir":    {Workdir: "/tmp"},
	} {
		r.Snapshot = "memsnap"
		_, _, err := m.fromSnapshot(t.Context(), &r)
		var fe *FieldError
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("create from a memory snapshot setting %s = %v; want invalid_argument naming it", field, err)
		}
	}
	// The fake runtime copies no memory.
	err = m.checkMemoryStart(CreateRequest{Snapshot: "memsnap"}, core.IsolationGVisor)
	var fe *FieldError
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.As(err, &fe) || fe.Field != "snapshot" {
		t.Errorf("checkMemoryStart on a runtime without memory copies = %v; want failed_precondition naming snapshot", err)
	}
}

// memRuntime is fakeRuntime copying memory: CheckpointLive writes an
// image.
type memRuntime struct{ *fakeRuntime }

func (memRuntime) CopiesMemory() bool { return true }

func (memRuntime) CheckpointLive(_ context.Context, _, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("memory"), 0o600)
}

// TestMemoryStartAdoptsSourceCA: a memory image keeps its source's egress
// CA beside it (the key 0600), and a sandbox started from it signs with
// that CA, which is what lands in its trust store; an image without one
// gives the sandbox its own; half a pair fails the create and leaves no
// egress state behind.
func TestMemoryStartAdoptsSourceCA(t *testing.T) {
	dir := t.TempDir()
	st := &snapMemStore{memStore: newMemStore(), snaps: map[string]core.Snapshot{}}
	eg := &fakeEgress{ids: map[string]policy.Policy{}}
	fs := &fakeFiles{files: map[string]string{}}
	rt := memRuntime{&fakeRuntime{running: map[string]runtime.Status{}}}
	m, err := New(Config{AgentPath: "/agent", SnapshotDir: dir, DefaultTemplate: "minimal", Logger: slog.New(slog.DiscardHandler),
		Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:      Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000}},
		Deps{Runtime: rt, Network: &fakeNet{ids: map[string]bool{}}, Templates: fakeTemplates{}, Store: st, Prober: fakeProber{}, Egress: eg, Files: &initFiles{fakeFiles: fs}})
	if err != nil {
		t.Fatal(err)
	}
	// Three images: one keeping the source's CA, one from before CAs
	// were kept, one with a certificate and no key.
	if _, err := eg.Prepare("src"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"withca", "noca", "halfca"} {
		image := m.snapshotMemoryIn(m.snapshotDir(id))
		if err := rt.CheckpointLive(t.Context(), "src", image); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(m.snapshotLayer(id), 0o755); err != nil {
			t.Fatal(err)
		}
		st.snaps[id] = core.Snapshot{ID: id, Kind: core.SnapshotMemory, Template: "minimal", Isolation: core.IsolationRunc,
			PidsLimit: 100, AgentToken: "srctoken", BaseLayers: []string{t.TempDir()}}
	}
	withCA := m.snapshotMemoryIn(m.snapshotDir("withca"))
	if err := m.keepSourceCA("src", withCA); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(withCA, imageCAKey)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept CA key: %v, %v; want mode 0600", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(withCA, imageCAKey)); err != nil || string(b) != "key:src" {
		t.Fatalf("kept CA key = %q, %v; want the source's", b, err)
	}
	half := m.snapshotMemoryIn(m.snapshotDir("halfca"))
	if err := os.WriteFile(filepath.Join(half, imageCACert), []byte("ca"), 0o644); err != nil {
		t.Fatal(err)
	}

	sb, err := m.Create(t.Context(), CreateRequest{Snapshot: "withca"})
	if err != nil {
		t.Fatalf("create from the image with a CA: %v", err)
	}
	if got := eg.adopted[sb.ID]; got != [2]string{"ca", "key:src"} {
		t.Errorf("the copy's adopted CA = %q; want the source's pair", got)
	}
	if got := fs.files[egressCAPath]; got != "ca" {
		t.Errorf("the copy trusts %q; want the source's CA", got)
	}

	sb2, err := m.Create(t.Context(), CreateRequest{Snapshot: "noca"})
	if err != nil {
		t.Fatalf("create from an image without a CA: %v", err)
	}
	if _, ok := eg.adopted[sb2.ID]; ok {
		t.Errorf("a copy of an image without a CA adopted one")
	}

	_, err = m.Create(t.Context(), CreateRequest{Snapshot: "halfca"})
	if err == nil || !strings.Contains(err.Error(), "egress CA") {
		t.Fatalf("create from an image with half a CA = %v; want an error about its egress CA", err)
	}
	ids, _ := eg.List()
	slices.Sort(ids)
	want := []string{sb.ID, sb2.ID, "src"}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("egress state after the failed create: %v; want only %v", ids, want)
	}
}
