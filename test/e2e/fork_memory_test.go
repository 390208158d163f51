package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// snapshotsAt is what a snapshot keeps at isolation level iso on d
// (client.SnapshotMemory or client.SnapshotFilesystem), as its health
// says.
func snapshotsAt(t *testing.T, d *Daemon, iso string) string {
	t.Helper()
	return isolationLevel(t, d, iso).Snapshots
}

// isolationLevel is level name as d's health reports it.
func isolationLevel(t *testing.T, d *Daemon, name string) client.IsolationLevel {
	t.Helper()
	h, err := d.Client.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range h.Isolation {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("health lists no isolation level %q: %+v", name, h.Isolation)
	return client.IsolationLevel{}
}

// TestForkMemoryGVisor: an E2B fork of a gVisor sandbox (on a runsc that
// copies memory) makes live copies that carry on the parent's running
// processes with their memory (a counter keeps counting from where it
// was, its 48 MiB in memory unchanged) while the parent runs on; each
// copy has its own identity: sandbox ID in the environment of what it
// starts, hostname, address, MAC, and agent token (the parent's no
// longer opens the copy's agent; its own does), but the parent's egress
// CA, which its processes trust; memory and files are independent; the
// kernel's randomness differs. The fork's snapshot goes
// with its copies, and nothing leaks.
func TestForkMemoryGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d := StartDaemon(t)
	if k := snapshotsAt(t, d, client.IsolationGVisor); k != client.SnapshotMemory {
		t.Skipf("this runsc's snapshots keep %s only (it cannot restore one sandbox's memory into another)", k)
	}
	ctx := t.Context()
	key := createKey(t, d, "fork-memory")
	if _, err := d.Client.SetTemplateIsolation(ctx, "minimal", client.IsolationGVisor); err != nil {
		t.Fatal(err)
	}
	status, body := sendWithKey(t, http.MethodPost, d.URL+"/sandboxes", key, `{"templateID":"minimal","timeout":1200,"envVars":{"FOO":"bar"}}`)
	if status != http.StatusCreated {
		t.Fatalf("E2B create = %d %s", status, body)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
		Token     string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil || created.Token == "" {
		t.Fatalf("E2B create answer %s: %v", body, err)
	}
	parent, err := d.Client.Get(ctx, created.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	startCounter(t, parent)
	MustRun(t, parent, "echo parent > /home/user/f && echo shm > /dev/shm/note")
	before := readCount(t, parent)

	status, body = sendWithKey(t, http.MethodPost, d.URL+"/sandboxes/"+parent.ID+"/fork", key, `{"count":2,"timeout":600}`)
	if status != http.StatusCreated {
		t.Fatalf("E2B fork = %d %s\n%s", status, body, d.Logs())
	}
	var results []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
			Token     string `json:"envdAccessToken"`
		} `json:"sandbox"`
		Error any `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &results); err != nil || len(results) != 2 {
		t.Fatalf("E2B fork answer %s: %v; want two entries", body, err)
	}
	snaps, err := d.Client.Snapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].Kind != client.SnapshotMemory || !snaps[0].Fork {
		t.Fatalf("snapshots during the fork's life = %+v, %v; want one memory fork snapshot", snaps, err)
	}
	if snaps[0].SizeBytes < 48<<20 {
		t.Errorf("the fork's snapshot takes %d bytes, less than the counter's 48 MiB in memory", snaps[0].SizeBytes)
	}

	type copyOf struct {
		sb    *client.Sandbox
		token string
	}
	var copies []copyOf
	tokens := map[string]bool{created.Token: true}
	for i, r := range results {
		if r.Sandbox == nil || r.Sandbox.SandboxID == "" || r.Sandbox.Token == "" {
			t.Fatalf("fork entry %d = %+v; want a sandbox with a token", i, r)
		}
		tokens[r.Sandbox.Token] = true
		sb, err := d.Client.Get(ctx, r.Sandbox.SandboxID)
		if err != nil || sb.State != client.StateReady || sb.Isolation != client.IsolationGVisor {
			t.Fatalf("copy %d: %+v, %v", i, sb, err)
		}
		copies = append(copies, copyOf{sb, r.Sandbox.Token})
	}
	if len(tokens) != 3 {
		t.Errorf("the parent and its two copies share agent tokens: %v", tokens)
	}

	// The parent's processes carry on in every copy, memory and all, and
	// in the parent.
	assertCounting(t, parent, before, "the parent after the fork")
	for i, c := range copies {
		assertCounting(t, c.sb, before, "copy "+string(rune('a'+i)))
		assertFiltered(t, c.sb, "copy "+string(rune('a'+i)))
		if got := MustRun(t, c.sb, "cat /home/user/f /dev/shm/note; echo $FOO"); got != "parent\nshm\nbar\n" {
			t.Errorf("copy %d sees %q; want the parent's file, its memory file and FOO", i, got)
		}
	}

	// The copies' processes trust the parent's egress CA (they loaded it
	// before the fork), so the copies' proxies sign with it.
	parentCA := MustRun(t, parent, "cat /etc/berth/egress-ca.pem")
	for i, c := range copies {
		if got := MustRun(t, c.sb, "cat /etc/berth/egress-ca.pem"); got != parentCA || !strings.Contains(got, "BEGIN CERTIFICATE") {
			t.Errorf("copy %d's egress CA differs from the parent's, which its processes trust", i)
		}
	}

	// Identity: each its own.
	addrs, macs, hosts, rand := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, sb := range []*client.Sandbox{parent, copies[0].sb, copies[1].sb} {
		got, err := d.Client.Get(ctx, sb.ID)
		if err != nil || got.Network == nil {
			t.Fatalf("sandbox %s: %+v, %v", sb.ID, got, err)
		}
		addrs[got.Network.Address] = true
		out := MustRun(t, sb, "echo $BERTH_SANDBOX_ID; hostname; ip -o link | grep -o 'link/ether [0-9a-f:]*' | head -n 1; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		f := strings.Split(strings.TrimSpace(out), "\n")
		if len(f) != 4 || f[0] != sb.ID || f[1] != "berth-"+sb.ID[:12] || !strings.HasPrefix(f[2], "link/ether ") || len(f[3]) != 32 {
			t.Errorf("sandbox %d (%s) says %q; want its own ID and hostname", i, sb.ID, out)
			continue
		}
		macs[f[2]], rand[f[3]] = true, true
		hosts[f[1]] = true
	}
	if len(addrs) != 3 || len(macs) != 3 || len(hosts) != 3 || len(rand) != 3 {
		t.Errorf("addresses %v, MACs %v, hostnames %v, random bytes %v: want three different of each", addrs, macs, hosts, rand)
	}
	// The copy's agent takes its own token and no longer the parent's
	// (asked from inside the copy, over its loopback).
	for i, c := range copies {
		probe := fmt.Sprintf(`for t in %q %q; do if wget -q -O- --header "X-Access-Token: $t" http://127.0.0.1:49983/envs; then echo; else echo refused; fi; done`, created.Token, c.token)
		out := MustRun(t, c.sb, probe)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || lines[0] != "refused" || !strings.Contains(lines[1], c.sb.ID) {
			t.Errorf("copy %d's agent with the parent's token, then its own: %q; want refused, then its env naming %s", i, out, c.sb.ID)
		}
	}

	// Independent: what one copy writes, in files or in memory, neither
	// the other nor the parent sees.
	MustRun(t, copies[0].sb, "echo mine > /home/user/f && echo a > /dev/shm/note")
	for _, sb := range []*client.Sandbox{copies[1].sb, parent} {
		if got := MustRun(t, sb, "cat /home/user/f /dev/shm/note"); got != "parent\nshm\n" {
			t.Errorf("%s sees %q after copy a wrote; want the parent's", sb.ID, got)
		}
	}

	for _, c := range copies {
		if status, body := sendWithKey(t, http.MethodDelete, d.URL+"/sandboxes/"+c.sb.ID, key, ""); status != http.StatusNoContent {
			t.Errorf("E2B kill %s = %d %s", c.sb.ID, status, body)
		}
	}
	if snaps, err := d.Client.Snapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after the copies are gone = %+v, %v; want none", snaps, err)
	}
	harness.AssertSnapshotsClean(t, d)
	assertCounting(t, parent, readCount(t, parent), "the parent after its copies are gone")
	if err := d.Client.Kill(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// TestSnapshotExportImportMemoryGVisor: a memory snapshot of a gVisor
// sandbox exported from one daemon and imported into another (its own
// data dir) stays a memory snapshot there, and a sandbox made from it
// runs the source's processes with their memory, under its own identity,
// with the source's egress CA.
func TestSnapshotExportImportMemoryGVisor(t *testing.T) {
	requireIsolation(t, client.IsolationGVisor)
	d1 := StartDaemon(t)
	if k := snapshotsAt(t, d1, client.IsolationGVisor); k != client.SnapshotMemory {
		t.Skipf("this runsc's snapshots keep %s only", k)
	}
	d2 := StartDaemon(t)
	ctx := t.Context()
	src := d1.Create(t, client.CreateRequest{Isolation: client.IsolationGVisor, Memory: "512M", Timeout: "30m"})
	startCounter(t, src)
	MustRun(t, src, "echo portable > /home/f")
	before := readCount(t, src)
	snap, err := d1.Client.Snapshot(ctx, src.ID, "memory")
	if err != nil || snap.Kind != client.SnapshotMemory {
		t.Fatalf("snapshot = %+v, %v; want a memory snapshot", snap, err)
	}
	file := filepath.Join(t.TempDir(), "snap.tar")
	if out, stderr, code := d1.CLI(t, nil, "snapshot", "export", snap.ID, "-o", file); code != 0 {
		t.Fatalf("snapshot export: %d %s %s", code, out, stderr)
	}
	out, stderr, code := d2.CLI(t, nil, "snapshot", "import", file)
	if code != 0 {
		t.Fatalf("snapshot import: %d %s %s", code, out, stderr)
	}
	imported, err := d2.Client.GetSnapshot(ctx, strings.TrimSpace(out))
	if err != nil || imported.Kind != client.SnapshotMemory || imported.SizeBytes < 48<<20 {
		t.Fatalf("imported snapshot = %+v, %v; want a memory snapshot holding the counter's 48 MiB", imported, err)
	}
	sb, err := d2.Client.Create(ctx, client.CreateRequest{Snapshot: imported.ID})
	if err != nil {
		t.Fatalf("create from the imported memory snapshot: %v\n%s", err, d2.Logs())
	}
	assertCounting(t, sb, before, "the sandbox from the imported snapshot")
	if got, want := MustRun(t, sb, "cat /etc/berth/egress-ca.pem"), MustRun(t, src, "cat /etc/berth/egress-ca.pem"); got != want {
		t.Errorf("the sandbox from the imported snapshot has an egress CA other than its source's, which its processes trust")
	}
	if got := MustRun(t, sb, "cat /home/f; echo $BERTH_SANDBOX_ID; hostname"); got != "portable\n"+sb.ID+"\nberth-"+sb.ID[:12]+"\n" {
		t.Errorf("the sandbox from the imported snapshot says %q; want the file, its own ID and hostname", got)
	}
	if err := d2.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d  *Daemon
		id string
	}{{d1, snap.ID}, {d2, imported.ID}} {
		if err := c.d.Client.RemoveSnapshot(ctx, c.id); err != nil {
			t.Errorf("remove %s: %v", c.id, err)
		}
		harness.AssertSnapshotsClean(t, c.d)
	}
	if err := d1.Client.Kill(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d1)
	AssertNoLeaks(t, d2)
}
