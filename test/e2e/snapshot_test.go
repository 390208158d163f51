package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestSnapshotCreateFrom: `berth snapshot` copies a running sandbox's
// files (deletions too) while it keeps running, with its env, labels and
// network policy; `berth create --snapshot` starts an independent sandbox
// from it; the snapshot survives a daemon restart; removing one in use is
// refused, an unknown one is not found naming snapshot, and nothing is
// left once it is removed. On both isolation levels (a filesystem
// snapshot under runc; a memory one under gVisor where runsc can).
func TestSnapshotCreateFrom(t *testing.T) {
	forEachIsolation(t, func(t *testing.T, iso string) {
		d := StartDaemon(t)
		ctx := t.Context()
		src := d.Create(t, client.CreateRequest{
			Isolation: iso, Env: map[string]string{"FOO": "bar"}, Labels: map[string]string{"team": "a"}, Timeout: "30m",
			Network: &client.NetworkPolicy{Mode: "allow", Allow: []string{"example.com"}},
		})
		MustRun(t, src, "test -e /etc/profile; rm /etc/profile; echo data > /home/f; sleep 1000 >/dev/null 2>&1 &")

		out, stderr, code := d.CLI(t, nil, "snapshot", src.ID, "--name", "first")
		if code != 0 {
			t.Fatalf("berth snapshot: %d %s %s", code, out, stderr)
		}
		snapID := strings.TrimSpace(out)
		snap, err := d.Client.GetSnapshot(ctx, snapID)
		if err != nil || snap.Kind != snapshotsAt(t, d, iso) || snap.Source != src.ID || snap.Name != "first" || snap.SizeBytes <= 0 || snap.Template == "" {
			t.Fatalf("GetSnapshot = %+v, %v; want a %s snapshot of %s with a size", snap, err, snapshotsAt(t, d, iso), src.ID)
		}
		// The source kept running, its processes included.
		if got, err := d.Client.Get(ctx, src.ID); err != nil || got.State != client.StateReady {
			t.Fatalf("source after snapshot: %+v, %v; want ready", got, err)
		}
		MustRun(t, src, "pidof sleep >/dev/null && echo later > /home/g")

		out, stderr, code = d.CLI(t, nil, "create", "--snapshot", snapID)
		if code != 0 {
			t.Fatalf("berth create --snapshot: %d %s %s", code, out, stderr)
		}
		cp, err := d.Client.Get(ctx, strings.TrimSpace(out))
		if err != nil {
			t.Fatal(err)
		}
		if cp.Isolation != iso || cp.Labels["team"] != "a" || cp.Env["FOO"] != "bar" {
			t.Errorf("copy = %+v; want isolation %s, the source's labels and env", cp.Sandbox, iso)
		}
		got := MustRun(t, cp, "cat /home/f; test -e /etc/profile && echo profile; test -e /home/g && echo g; echo $FOO")
		if got != "data\nbar\n" {
			t.Errorf("copy sees %q; want the snapshot's file, /etc/profile still deleted, no later file, FOO", got)
		}
		// A memory snapshot's copy runs what its source ran; a
		// filesystem one's starts afresh.
		running := MustRun(t, cp, "pidof sleep >/dev/null && echo running || echo none")
		if want := map[string]string{client.SnapshotMemory: "running\n", client.SnapshotFilesystem: "none\n"}[snap.Kind]; running != want {
			t.Errorf("the source's sleep in a copy from a %s snapshot: %q, want %q", snap.Kind, running, want)
		}
		if pol, err := d.Client.NetworkPolicy(ctx, cp.ID); err != nil || pol.Mode != "allow" || !slices.Contains(pol.Allow, "example.com") {
			t.Errorf("copy's network policy = %+v, %v; want the source's", pol, err)
		}
		MustRun(t, cp, "echo copy > /home/f")
		if got := MustRun(t, src, "cat /home/f"); got != "data\n" {
			t.Errorf("source sees %q after the copy wrote; want its own data", got)
		}

		// In use: refused, clearly.
		_, stderr, code = d.CLI(t, nil, "snapshot", "rm", snapID)
		if code == 0 || !strings.Contains(stderr, "in use") || !strings.Contains(stderr, cp.ID) {
			t.Errorf("snapshot rm in use: exit %d, %q; want refused naming %s", code, stderr, cp.ID)
		}
		// Unknown: not found, naming snapshot.
		_, err = d.Client.Create(ctx, client.CreateRequest{Snapshot: "nosuchsnapshot0"})
		var ee *errdefs.Error
		if !errors.Is(err, errdefs.ErrNotFound) || !errors.As(err, &ee) || ee.Field != "snapshot" {
			t.Errorf("create from an unknown snapshot = %v; want not_found naming snapshot", err)
		}

		// Durable across a restart.
		d.Stop()
		d.Start()
		if again, err := d.Client.GetSnapshot(ctx, snapID); err != nil || again.SizeBytes != snap.SizeBytes {
			t.Errorf("after a restart: %+v, %v; want the snapshot as before", again, err)
		}
		harness.AssertSnapshotsClean(t, d, snapID)
		if err := d.Client.Kill(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
		out, stderr, code = d.CLI(t, nil, "snapshot", "ls")
		if code != 0 || !strings.Contains(out, snapID) || !strings.Contains(out, "first") {
			t.Errorf("snapshot ls: %d %q %s", code, out, stderr)
		}
		if _, stderr, code = d.CLI(t, nil, "snapshot", "rm", snapID); code != 0 {
			t.Fatalf("snapshot rm: %d %s", code, stderr)
		}
		if _, err := d.Client.GetSnapshot(ctx, snapID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("GetSnapshot after rm = %v; want not found", err)
		}
		harness.AssertSnapshotsClean(t, d)
		if err := d.Client.Kill(ctx, src.ID); err != nil {
			t.Fatal(err)
		}
		AssertNoLeaks(t, d)
	})
}

// TestFork: `berth fork -n 2` makes two live copies of a running sandbox;
// the parent keeps running; each copy has its own ID, network address and
// MAC, and what one writes neither the other nor the parent sees; the
// fork's snapshot goes with the last copy.
func TestFork(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	parent := d.Create(t, client.CreateRequest{Timeout: "30m"})
	MustRun(t, parent, "echo parent > /home/f")
	out, stderr, code := d.CLI(t, nil, "fork", parent.ID, "-n", "2")
	if code != 0 {
		t.Fatalf("berth fork: %d %s %s", code, out, stderr)
	}
	ids := strings.Fields(out)
	if len(ids) != 2 || ids[0] == ids[1] || slices.Contains(ids, parent.ID) {
		t.Fatalf("fork printed %q; want two new IDs", out)
	}
	if got, err := d.Client.Get(ctx, parent.ID); err != nil || got.State != client.StateReady {
		t.Fatalf("parent after fork: %+v, %v", got, err)
	}
	addrs := map[string]bool{}
	macs := map[string]bool{}
	for i, id := range append([]string{parent.ID}, ids...) {
		sb, err := d.Client.Get(ctx, id)
		if err != nil || sb.State != client.StateReady || sb.Network == nil {
			t.Fatalf("sandbox %s: %+v, %v", id, sb, err)
		}
		addrs[sb.Network.Address] = true
		macs[MustRun(t, sb, "cat /sys/class/net/eth0/address")] = true
		if got := MustRun(t, sb, "cat /home/f"); got != "parent\n" {
			t.Errorf("sandbox %d sees %q; want the parent's file", i, got)
		}
	}
	if len(addrs) != 3 || len(macs) != 3 {
		t.Errorf("addresses %v, MACs %v: want three of each", addrs, macs)
	}
	a, _ := d.Client.Get(ctx, ids[0])
	b, _ := d.Client.Get(ctx, ids[1])
	MustRun(t, a, "echo mine > /home/f; echo only-a > /home/a")
	if got := MustRun(t, b, "cat /home/f; test -e /home/a && echo leaked; true"); got != "parent\n" {
		t.Errorf("copy b sees %q after copy a wrote; want the parent's file only", got)
	}
	if got := MustRun(t, parent, "cat /home/f; test -e /home/a && echo leaked; true"); got != "parent\n" {
		t.Errorf("parent sees %q after copy a wrote", got)
	}
	snaps, err := d.Client.Snapshots(ctx)
	if err != nil || len(snaps) != 1 || !snaps[0].Fork || snaps[0].Source != parent.ID {
		t.Fatalf("snapshots during the fork's life = %+v, %v; want its one fork snapshot", snaps, err)
	}
	if _, err := d.Client.Fork(ctx, parent.ID, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("fork -n 0 = %v; want invalid_argument", err)
	}
	for _, id := range ids {
		if err := d.Client.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if snaps, err := d.Client.Snapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after the copies are gone = %+v, %v; want none", snaps, err)
	}
	harness.AssertSnapshotsClean(t, d)
	if err := d.Client.Kill(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// TestSnapshotExportImport: a snapshot exported from one daemon imports
// into another (its own data dir) and a sandbox made there has its files;
// a tampered or truncated archive is refused with invalid_argument naming
// the file, leaving nothing behind.
func TestSnapshotExportImport(t *testing.T) {
	d1 := StartDaemon(t)
	d2 := StartDaemon(t)
	ctx := t.Context()
	src := d1.Create(t, client.CreateRequest{Env: map[string]string{"FOO": "bar"}})
	MustRun(t, src, "mkdir -p /home/dir && echo portable > /home/dir/f && ln -s dir/f /home/link && rm /etc/profile")
	snap, err := d1.Client.Snapshot(ctx, src.ID, "exported")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "snap.tar")
	if out, stderr, code := d1.CLI(t, nil, "snapshot", "export", snap.ID, "-o", file); code != 0 {
		t.Fatalf("snapshot export: %d %s %s", code, out, stderr)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Tampered: one byte of the layer flipped (the last bytes are tar
	// padding; the layer's file data sits before them).
	bad := filepath.Join(t.TempDir(), "bad.tar")
	tampered := slices.Clone(data)
	i := strings.LastIndex(string(tampered), "portable")
	if i < 0 {
		t.Fatal("archive does not hold the file's content")
	}
	tampered[i] = 'P'
	os.WriteFile(bad, tampered, 0o600)
	short := filepath.Join(t.TempDir(), "short.tar")
	os.WriteFile(short, data[:len(data)/2], 0o600)
	for _, f := range []string{bad, short} {
		_, stderr, code := d2.CLI(t, nil, "snapshot", "import", f)
		if code == 0 || !strings.Contains(stderr, "import snapshot: archive: ") {
			t.Errorf("import %s: exit %d %q; want refused with the archive's fault", filepath.Base(f), code, stderr)
		}
		harness.AssertSnapshotsClean(t, d2)
	}
	out, stderr, code := d2.CLI(t, nil, "snapshot", "import", file)
	if code != 0 {
		t.Fatalf("snapshot import: %d %s %s", code, out, stderr)
	}
	imported := strings.TrimSpace(out)
	sb, err := d2.Client.Create(ctx, client.CreateRequest{Snapshot: imported})
	if err != nil {
		t.Fatal(err)
	}
	if got := MustRun(t, sb, "cat /home/link; test -e /etc/profile && echo profile; echo $FOO"); got != "portable\nbar\n" {
		t.Errorf("sandbox from the imported snapshot sees %q; want the file through its link, /etc/profile deleted, FOO", got)
	}
	if err := d2.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d  *Daemon
		id string
	}{{d1, snap.ID}, {d2, imported}} {
		if err := c.d.Client.RemoveSnapshot(ctx, c.id); err != nil {
			t.Errorf("remove %s: %v", c.id, err)
		}
		harness.AssertSnapshotsClean(t, c.d)
	}
}
