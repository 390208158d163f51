package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestVolumes: a volume's files outlive the sandboxes that bind it and are
// shared live between those that bind it at once, under runc and gVisor,
// read-write or read-only; the sandbox's uids own what it writes; a full
// volume is ENOSPC inside it; a pause and resume (files or memory), a
// snapshot and a SIGKILL of the daemon keep it bound; it cannot be deleted
// while a sandbox binds it; bad requests name their field; and nothing of
// it stays mounted once no sandbox binds it.
func TestVolumes(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	c := d.Client
	out, _, code := d.CLI(t, nil, "volume", "create", "work", "--size", "64M")
	if code != 0 {
		t.Fatalf("berth volume create exited %d: %s", code, out)
	}
	volID := strings.TrimSpace(out)
	v, err := c.GetVolume(ctx, "work")
	if err != nil || v.ID != volID || v.SizeBytes != 64<<20 || len(v.Sandboxes) != 0 {
		t.Fatalf("GetVolume(work) = %+v, %v; want %s of 64 MiB bound nowhere", v, err, volID)
	}

	a := d.Create(t, client.CreateRequest{Volumes: []client.VolumeMount{{Volume: "work", Path: "/work"}}, Timeout: "30m"})
	if len(a.Volumes) != 1 || a.Volumes[0].Volume != volID || a.Volumes[0].Name != "work" || a.Volumes[0].Path != "/work" {
		t.Errorf("the sandbox's volumes = %+v", a.Volumes)
	}
	MustRun(t, a, "echo from-a > /work/a && mkdir -p /work/dir && echo deep > /work/dir/f")
	// nosuid and nodev: a set-user-ID file one sandbox leaves there raises
	// nobody in another.
	if got := MustRun(t, a, "grep ' /work ' /proc/mounts"); !strings.Contains(got, "nosuid") || !strings.Contains(got, "nodev") {
		t.Errorf("the volume's bind: %q, want nosuid and nodev", got)
	}
	if got := MustRun(t, a, "stat -c %u /work/a; id -u"); len(strings.Fields(got)) != 2 || strings.Fields(got)[0] != strings.Fields(got)[1] {
		t.Errorf("the file's owner and the writer's uid in the sandbox = %q, want the same", got)
	}
	// A second sandbox, read-only, at once: it sees a's files and a's
	// later writes, and cannot write.
	isos := []string{client.IsolationRunc}
	if _, err := exec.LookPath("runsc"); err == nil {
		isos = append(isos, client.IsolationGVisor)
	}
	t.Logf("readers at %v", isos)
	var readers []*client.Sandbox
	for _, iso := range isos {
		r := d.Create(t, client.CreateRequest{Isolation: iso, Volumes: []client.VolumeMount{{Volume: volID, Path: "/mnt/shared", ReadOnly: true}}, Timeout: "30m"})
		if got := MustRun(t, r, "cat /mnt/shared/a /mnt/shared/dir/f"); got != "from-a\ndeep\n" {
			t.Errorf("%s reader: the volume's files = %q", iso, got)
		}
		if o, e, code := Run(t, r, "echo no > /mnt/shared/b"); code == 0 || !strings.Contains(o+e, "Read-only") {
			t.Errorf("%s reader: a write on a read-only bind = %d %q %q, want refused read-only", iso, code, o, e)
		}
		readers = append(readers, r)
	}
	MustRun(t, a, "echo later > /work/later")
	for i, r := range readers {
		if got := MustRun(t, r, "cat /mnt/shared/later"); got != "later\n" {
			t.Errorf("%s reader: a's write after it started = %q", isos[i], got)
		}
	}
	// The cap: a full volume is ENOSPC in it, and the sandbox's own disk
	// is untouched by it.
	if o, e, code := Run(t, a, "dd if=/dev/zero of=/work/big bs=1M count=100"); code == 0 || !strings.Contains(o+e, "No space left") {
		t.Errorf("writing 100 MiB into a 64 MiB volume = %d %q %q, want no space left", code, o, e)
	}
	MustRun(t, a, "rm /work/big && echo fine > /tmp/own-disk")

	// Bound: the delete is refused, naming a sandbox; CLI too.
	if err := c.RemoveVolume(ctx, "work"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), a.ID) {
		t.Errorf("RemoveVolume while bound = %v, want failed_precondition naming %s", err, a.ID)
	}
	if _, e, code := d.CLI(t, nil, "volume", "rm", "work"); code == 0 || !strings.Contains(e, "failed_precondition") {
		t.Errorf("berth volume rm while bound exited %d: %s", code, e)
	}
	if v, err := c.GetVolume(ctx, volID); err != nil || len(v.Sandboxes) != 1+len(readers) || v.UsedBytes <= 0 {
		t.Errorf("GetVolume = %+v, %v; want a and the readers binding it, and some bytes used", v, err)
	}

	// Bad requests name their field and make nothing.
	for _, c2 := range []struct {
		vols  []client.VolumeMount
		field string
	}{
		{[]client.VolumeMount{{Volume: "nope", Path: "/x"}}, "volumes[0].volume"},
		{[]client.VolumeMount{{Volume: "work", Path: "/proc/x"}}, "volumes[0].path"},
		{[]client.VolumeMount{{Volume: "work", Path: "relative"}}, "volumes[0].path"},
	} {
		_, err := c.Create(ctx, client.CreateRequest{Volumes: c2.vols})
		var apiErr *errdefs.Error
		if !errors.As(err, &apiErr) || apiErr.Field != c2.field {
			t.Errorf("Create with %+v = %v, want an error on %s", c2.vols, err, c2.field)
		}
	}
	if _, e, code := d.CLI(t, nil, "create", "--volume", "work"); code == 0 || !strings.Contains(e, "--volume") {
		t.Errorf("berth create --volume work exited %d: %s", code, e)
	}
	if _, err := c.CreateVolume(ctx, "work", ""); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a second volume named work = %v, want already_exists", err)
	}
	if _, err := c.CreateVolume(ctx, "tiny", "1M"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a 1 MiB volume = %v, want invalid_argument", err)
	}

	// Files in and out without a sandbox: berth volume cp both ways (a
	// tree, a file), and the native file calls; a path never leaves the
	// volume.
	local := t.TempDir()
	writeTree(t, filepath.Join(local, "tree"), map[string]string{"top.txt": "top", "sub/deep.txt": "deep"})
	if err := os.Chmod(filepath.Join(local, "tree", "sub", "deep.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, e, code := d.CLI(t, nil, "volume", "cp", filepath.Join(local, "tree"), "work:/from-host"); code != 0 {
		t.Fatalf("berth volume cp up exited %d: %s", code, e)
	}
	if got := MustRun(t, a, "cat /work/from-host/top.txt /work/from-host/sub/deep.txt; stat -c %a /work/from-host/sub/deep.txt"); got != "topdeep600\n" {
		t.Errorf("the uploaded tree in the sandbox: %q", got)
	}
	if _, e, code := d.CLI(t, nil, "volume", "cp", "work:/dir", filepath.Join(local, "down")); code != 0 {
		t.Fatalf("berth volume cp down exited %d: %s", code, e)
	}
	assertTree(t, filepath.Join(local, "down"), map[string]string{"f": "deep\n"})
	if _, e, code := d.CLI(t, nil, "volume", "cp", "work:/a", filepath.Join(local, "single")); code != 0 {
		t.Fatalf("berth volume cp of a file exited %d: %s", code, e)
	}
	assertTree(t, local, map[string]string{"single": "from-a\n"})
	if _, e, code := d.CLI(t, nil, "volume", "cp", "work:/a", "work:/b"); code == 0 || !strings.Contains(e, "exactly one") {
		t.Errorf("berth volume cp between two volumes exited %d: %s", code, e)
	}
	var readBack bytes.Buffer
	if err := c.ReadVolumeFile(ctx, "work", "/from-host/top.txt", &readBack); err != nil || readBack.String() != "top" {
		t.Errorf("ReadVolumeFile = %q, %v", readBack.String(), err)
	}
	for _, p := range []string{"/../../etc/passwd", "/nope"} {
		var apiErr *errdefs.Error
		if err := c.ReadVolumeFile(ctx, "work", p, io.Discard); !errors.As(err, &apiErr) || apiErr.Field != "path" {
			t.Errorf("ReadVolumeFile(%s) = %v, want an error on path", p, err)
		}
	}
	if err := c.RemoveVolumePath(ctx, "work", "/from-host"); err != nil {
		t.Fatal(err)
	}
	if o, _, code := Run(t, a, "ls /work/from-host"); code == 0 {
		t.Errorf("the removed tree is still in the sandbox: %q", o)
	}

	// A key's volumes: bounded by its quota, unseen by others, and others'
	// unseen and unbindable by it.
	_, keyed := newKey(t, d, client.CreateAPIKeyRequest{Name: "volumes", Quota: &client.Quota{MaxVolumeSize: "100M"}})
	if _, err := keyed.CreateVolume(ctx, "mine", "64M"); err != nil {
		t.Fatal(err)
	}
	var apiErr *errdefs.Error
	if _, err := keyed.CreateVolume(ctx, "more", "64M"); !errors.Is(err, errdefs.ErrResourceExhausted) || !errors.As(err, &apiErr) || apiErr.Field != "size" {
		t.Errorf("a volume past the key's max_volume_size = %v, want resource_exhausted on size", err)
	}
	if _, err := keyed.GetVolume(ctx, "work"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's GetVolume(work) = %v, want not_found", err)
	}
	if _, err := keyed.GetVolume(ctx, volID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's GetVolume(%s) = %v, want not_found", volID, err)
	}
	if list, err := keyed.Volumes(ctx); err != nil || len(list) != 1 || list[0].Name != "mine" {
		t.Errorf("the key's Volumes = %+v, %v; want only its own", list, err)
	}
	if _, err := keyed.Create(ctx, client.CreateRequest{Volumes: []client.VolumeMount{{Volume: volID, Path: "/x"}}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key binding %s = %v, want not_found", volID, err)
	}
	if err := keyed.RemoveVolume(ctx, "mine"); err != nil {
		t.Fatal(err)
	}

	// Paused and resumed, with its files or its memory: bound again.
	for _, sb := range append([]*client.Sandbox{a}, readers...) {
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatalf("pause %s: %v", sb.ID, err)
		}
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatalf("resume %s: %v\n%s", sb.ID, err, d.Logs())
		}
	}
	MustRun(t, a, "echo after-resume > /work/resumed")
	for i, r := range readers {
		if got := MustRun(t, r, "cat /mnt/shared/resumed"); got != "after-resume\n" {
			t.Errorf("%s reader after its resume: %q", isos[i], got)
		}
	}
	// A fork (under gVisor: a copy of the running memory) binds it too.
	for i, r := range readers {
		fork, err := c.Fork(ctx, r.ID, 1)
		if err != nil {
			t.Fatalf("fork of the %s reader: %v\n%s", isos[i], err, d.Logs())
		}
		cp := fork.Sandboxes[0]
		if len(cp.Volumes) != 1 || cp.Volumes[0].Volume != volID || !cp.Volumes[0].ReadOnly {
			t.Errorf("the %s fork binds %+v", isos[i], cp.Volumes)
		}
		if got := MustRun(t, cp, "cat /mnt/shared/resumed"); got != "after-resume\n" {
			t.Errorf("the %s fork reads %q", isos[i], got)
		}
		if err := c.Kill(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot's sandbox binds the same volume.
	snap, err := c.Snapshot(ctx, a.ID, "with-volume")
	if err != nil {
		t.Fatal(err)
	}
	b := d.Create(t, client.CreateRequest{Snapshot: snap.ID})
	if len(b.Volumes) != 1 || b.Volumes[0].Volume != volID || b.Volumes[0].Path != "/work" {
		t.Errorf("the snapshot's sandbox binds %+v, want the volume at /work", b.Volumes)
	}
	if got := MustRun(t, b, "cat /work/resumed /tmp/own-disk"); got != "after-resume\nfine\n" {
		t.Errorf("the snapshot's sandbox reads %q", got)
	}
	// Exported and imported, it names the volume by name: a sandbox from
	// the import binds this daemon's volume called work.
	var archive bytes.Buffer
	if err := c.ExportSnapshot(ctx, snap.ID, &archive); err != nil {
		t.Fatal(err)
	}
	imported, err := c.ImportSnapshot(ctx, &archive)
	if err != nil {
		t.Fatal(err)
	}
	fromImport := d.Create(t, client.CreateRequest{Snapshot: imported.ID})
	if len(fromImport.Volumes) != 1 || fromImport.Volumes[0].Volume != volID {
		t.Errorf("the imported snapshot's sandbox binds %+v, want work (%s)", fromImport.Volumes, volID)
	}
	if got := MustRun(t, fromImport, "cat /work/resumed"); got != "after-resume\n" {
		t.Errorf("the imported snapshot's sandbox reads %q", got)
	}
	if err := c.Kill(ctx, fromImport.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveSnapshot(ctx, imported.ID); err != nil {
		t.Fatal(err)
	}

	// The daemon killed and started again: the sandboxes keep their binds,
	// and the host keeps none of its own.
	d.Kill9()
	d.Start()
	MustRun(t, a, "echo after-restart > /work/restarted")
	if got := MustRun(t, b, "cat /work/restarted"); got != "after-restart\n" {
		t.Errorf("after the daemon's restart: %q", got)
	}
	for _, sb := range append([]*client.Sandbox{a, b}, readers...) {
		if err := c.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RemoveSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)

	// Unbound, its files are all there for the next sandbox.
	n := d.Create(t, client.CreateRequest{Volumes: []client.VolumeMount{{Volume: "work", Path: "/home/user/w"}}})
	if got := MustRun(t, n, "cat /home/user/w/a /home/user/w/restarted"); got != "from-a\nafter-restart\n" {
		t.Errorf("a later sandbox reads %q", got)
	}
	if err := c.Kill(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	if out, e, code := d.CLI(t, nil, "volume", "rm", "work"); code != 0 {
		t.Fatalf("berth volume rm once unbound exited %d: %s %s", code, out, e)
	}
	if _, err := c.GetVolume(ctx, volID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetVolume after rm = %v, want not_found", err)
	}
	if list, err := c.Volumes(ctx); err != nil || len(list) != 0 {
		t.Errorf("Volumes after rm = %+v, %v", list, err)
	}
	AssertNoLeaks(t, d)
}

// TestVolumesConcurrent: sandboxes made and destroyed at once, all binding
// one volume, each write their own file and see every other's; once they
// are gone the volume is mounted nowhere and can be deleted, and nothing
// is left.
func TestVolumesConcurrent(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	c := d.Client
	v, err := c.CreateVolume(ctx, "shared", "64M")
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	sbs := make([]*client.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sbs[i], errs[i] = c.Create(ctx, client.CreateRequest{Template: "minimal", Volumes: []client.VolumeMount{{Volume: v.ID, Path: "/shared"}}})
			if errs[i] == nil {
				var code int
				script := "echo " + strconv.Itoa(i) + " > /shared/" + strconv.Itoa(i)
				if _, _, code, errs[i] = harness.Exec(sbs[i], script); errs[i] == nil && code != 0 {
					errs[i] = fmt.Errorf("%q exited %d", script, code)
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("sandbox %d: %v\n%s", i, err, d.Logs())
		}
	}
	for i, sb := range sbs {
		if got := MustRun(t, sb, "ls /shared | wc -l"); strings.TrimSpace(got) != strconv.Itoa(n) {
			t.Errorf("sandbox %d sees %s files, want %d", i, strings.TrimSpace(got), n)
		}
	}
	for i := range n {
		wg.Go(func() { errs[i] = c.Kill(ctx, sbs[i].ID) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveVolume(ctx, v.ID); err != nil {
		t.Fatalf("RemoveVolume once every sandbox is gone: %v", err)
	}
	AssertNoLeaks(t, d)
}
