package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/template"
)

// snapRuntime is updRuntime that can show and freeze a sandbox's
// writable layer: every sandbox sits on layer alone.
type snapRuntime struct {
	*updRuntime
	layer, upper string
}

func (r *snapRuntime) UpperDir(string) (string, error)      { return r.upper, nil }
func (r *snapRuntime) Layers(string) ([]string, error)      { return []string{r.layer}, nil }
func (r *snapRuntime) Pause(context.Context, string) error  { return nil }
func (r *snapRuntime) Resume(context.Context, string) error { return nil }

// layerTemplates is template "minimal" on one real layer, and a
// LayerStore whose layers are empty directories and whose archives hold
// a marker.
type layerTemplates struct{ layer string }

func (t layerTemplates) Get(ctx context.Context, name string) (template.Template, error) {
	tpl, err := fakeTemplates{}.Get(ctx, name)
	tpl.Layers = []string{t.layer}
	return tpl, err
}

func (layerTemplates) FreezeLayer(_ context.Context, _, dst string) (int64, error) {
	return 0, os.Mkdir(dst, 0o755)
}

func (layerTemplates) ExportLayer(_ context.Context, _ string, w io.Writer) error {
	_, err := io.WriteString(w, "layer")
	return err
}

func (layerTemplates) ImportLayer(_ context.Context, r io.Reader, dst string) (int64, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return n, err
	}
	return n, os.Mkdir(dst, 0o755)
}

// TestSnapshotAllowSudo: a snapshot keeps its source's allow_sudo, and
// export and import keep it too; a create from a snapshot gets it unless
// the request says allow_sudo itself (true or false), as for the other
// settings a snapshot carries; a fork's copies get the parent's. What the
// runtime is asked for (no_new_privs off) follows.
func TestSnapshotAllowSudo(t *testing.T) {
	dir := t.TempDir()
	layer, upper := filepath.Join(dir, "tpl"), filepath.Join(dir, "upper")
	for _, d := range []string{layer, upper} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rt := &snapRuntime{updRuntime: &updRuntime{fakeRuntime: &fakeRuntime{running: map[string]runtime.Status{}}}, layer: layer, upper: upper}
	st := &snapMemStore{memStore: newMemStore(), snaps: map[string]core.Snapshot{}}
	m, err := New(Config{
		AgentPath: "/agent", DefaultTemplate: "minimal", SnapshotDir: filepath.Join(dir, "snapshots"),
		Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:      Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000},
		Logger:   slog.New(slog.DiscardHandler),
	}, Deps{
		Runtime: rt, Network: &fakeNet{ids: map[string]bool{}}, Templates: layerTemplates{layer}, Store: st, Prober: fakeProber{},
		Egress: &fakeEgress{ids: map[string]policy.Policy{}}, Files: &fakeFiles{files: map[string]string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	ctx := t.Context()

	snaps := map[bool]string{}
	for _, sudo := range []bool{false, true} {
		src, err := m.Create(ctx, CreateRequest{AllowSudo: new(sudo)})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := m.Snapshot(ctx, src.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := m.GetSnapshot(ctx, snap.ID); got.AllowSudo != sudo {
			t.Errorf("snapshot of a sandbox with allow_sudo %v: record has %v", sudo, got.AllowSudo)
		}
		var buf bytes.Buffer
		if err := m.ExportSnapshot(ctx, snap.ID, &buf); err != nil {
			t.Fatal(err)
		}
		// Labels given at import go over the archive's.
		imp, err := m.ImportSnapshot(ctx, &buf, "", map[string]string{"berth.dev/node": "n1"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if imp.AllowSudo != sudo {
			t.Errorf("export and import of a snapshot with allow_sudo %v: imported has %v", sudo, imp.AllowSudo)
		}
		if got, _ := m.GetSnapshot(ctx, imp.ID); got.Labels["berth.dev/node"] != "n1" {
			t.Errorf("imported with label berth.dev/node=n1: record labels %v", got.Labels)
		}
		// Under an ID asked for: a new one is taken, one the daemon has
		// or a bad one is refused, naming id, and nothing is made.
		archive := func() io.Reader {
			var b bytes.Buffer
			if err := m.ExportSnapshot(ctx, snap.ID, &b); err != nil {
				t.Fatal(err)
			}
			return &b
		}
		want := types.NewSandboxID()
		if kept, err := m.ImportSnapshot(ctx, archive(), "", nil, want); err != nil || kept.ID != want {
			t.Errorf("import under %s = %+v, %v", want, kept, err)
		}
		before, _ := m.Snapshots(ctx)
		for id, code := range map[string]string{want: errdefs.CodeAlreadyExists, snap.ID: errdefs.CodeAlreadyExists, "Bad_ID": errdefs.CodeInvalidArgument} {
			_, err := m.ImportSnapshot(ctx, archive(), "", nil, id)
			var fe *FieldError
			if errdefs.Code(err) != code || !errors.As(err, &fe) || fe.Field != "id" {
				t.Errorf("import under %s = %v, want %s on id", id, err, code)
			}
		}
		if after, _ := m.Snapshots(ctx); len(after) != len(before) {
			t.Errorf("refused imports left %d snapshots, want %d", len(after), len(before))
		}
		snaps[sudo] = snap.ID
		copies, _, err := m.Fork(ctx, src.ID, ForkRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		if c := copies[0]; c.AllowSudo != sudo || rt.madeSetuid(c.ID) != sudo {
			t.Errorf("fork of a sandbox with allow_sudo %v: copy has %v (runtime asked for setuid %v)", sudo, c.AllowSudo, rt.madeSetuid(c.ID))
		}
	}

	for _, c := range []struct {
		snap bool
		req  *bool
		want bool
	}{
		{snap: true, req: nil, want: true},
		{snap: true, req: new(false), want: false},
		{snap: true, req: new(true), want: true},
		{snap: false, req: nil, want: false},
		{snap: false, req: new(true), want: true},
		{snap: false, req: new(false), want: false},
	} {
		sb, err := m.Create(ctx, CreateRequest{Snapshot: snaps[c.snap], AllowSudo: c.req})
		if err != nil {
			t.Fatal(err)
		}
		if sb.AllowSudo != c.want || rt.madeSetuid(sb.ID) != c.want {
			t.Errorf("create from a snapshot with allow_sudo %v, request's %s: sandbox has %v (runtime asked for setuid %v), want %v",
				c.snap, fmtBoolPtr(c.req), sb.AllowSudo, rt.madeSetuid(sb.ID), c.want)
		}
	}
}

func fmtBoolPtr(b *bool) string {
	if b == nil {
		return "unset"
	}
	if *b {
		return "true"
	}
	return "false"
}
