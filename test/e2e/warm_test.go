package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// startEgressOn is startEgress on a test net the caller started, with
// its own daemon arguments.
func startEgressOn(t *testing.T, tn *harness.TestNet, args ...string) *egressEnv {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "egressprobe")
	cmd := exec.Command("go", "build", "-o", probe, "./test/harness/egressprobe")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build egressprobe: %v\n%s", err, out)
	}
	return &egressEnv{d: StartDaemon(t, args...), tn: tn, probe: probe}
}

// warmOf reports a template's warm pool as GET /v1/templates shows it.
func warmOf(t *testing.T, d *Daemon, name string) client.WarmPool {
	t.Helper()
	return warmPoolOf(t, d, name, false)
}

// warmPoolOf reports a template's plain or (sudo) sudo-capable warm pool
// as GET /v1/templates shows it.
func warmPoolOf(t *testing.T, d *Daemon, name string, sudo bool) client.WarmPool {
	t.Helper()
	ts, err := d.Client.Templates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		w := tp.Warm
		if sudo {
			w = tp.WarmSudo
		}
		if tp.Name == name && w != nil {
			return *w
		}
	}
	return client.WarmPool{}
}

func waitWarm(t *testing.T, d *Daemon, name string, ready int) {
	t.Helper()
	waitWarmPool(t, d, name, false, ready)
}

func waitWarmPool(t *testing.T, d *Daemon, name string, sudo bool, ready int) {
	t.Helper()
	waitFor(t, 90*time.Second, "warm pool of "+name+" (sudo "+strconv.FormatBool(sudo)+") at "+strconv.Itoa(ready), func() bool {
		return warmPoolOf(t, d, name, sudo).Ready == ready
	})
}

// createdWarm reports whether the sandbox's created event says it was
// claimed from a pool.
func createdWarm(t *testing.T, d *Daemon, id string) bool {
	t.Helper()
	evs, err := d.Client.Events(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == "created" {
			return strings.HasSuffix(e.Message, ", warm")
		}
	}
	t.Fatalf("sandbox %s has no created event: %+v", id, evs)
	return false
}

// leftovers lists what a sandbox holds beyond a fresh one: processes other
// than its agent and the command asking, and files in the places a
// sandbox's life writes to.
const leftovers = `for p in /proc/[0-9]*; do [ "${p#/proc/}" = 1 ] || [ "${p#/proc/}" = "$$" ] || echo "proc $(cat $p/comm 2>/dev/null)"; done
find /tmp /var/tmp /root /home /run -mindepth 1 2>/dev/null | sed 's/^/file /' | sort`

// A claimed warm sandbox is the sandbox a cold create makes: the request's
// limits are in its cgroup, its environment and labels are its own, its
// egress policy holds (denied by default, one host allowed), and nothing of
// the pool's life is left in it.
func TestWarmPoolClaimIsFresh(t *testing.T) {
	harness.RequireHost(t)
	tn := harness.StartTestNet(t)
	args := tn.ConfigFile(t)
	base, err := os.ReadFile(args[1])
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "warm.yaml")
	if err := os.WriteFile(cfg, append(base, "warm_pool: {minimal: 1}\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	env := startEgressOn(t, tn, "--config", cfg)
	d := env.d
	ctx := context.Background()
	waitWarm(t, d, "minimal", 1)
	if w := warmOf(t, d, "minimal"); w.Target != 1 {
		t.Fatalf("warm = %+v, want target 1", w)
	}
	// Pooled sandboxes are nobody's: no listing shows them.
	if sbs, err := d.Local.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Fatalf("list with a full pool = %d sandboxes, %v; want none", len(sbs), err)
	}

	ip1 := env.tn.IP.String()
	sb := d.Create(t, client.CreateRequest{
		Template: "minimal", CPU: 0.5, Memory: "200MiB", PIDs: 77, Timeout: "5m",
		Env:     map[string]string{"FOO": "bar", "SSL_CERT_FILE": "/mine.pem"},
		Labels:  map[string]string{"task": "warm"},
		Network: &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test"}},
	})
	if !createdWarm(t, d, sb.ID) {
		t.Fatalf("sandbox %s was not claimed from the pool (events say cold)", sb.ID)
	}
	// A cold one with the same request, to hold the claimed one to.
	cold := d.Create(t, client.CreateRequest{
		Template: "minimal", CPU: 0.5, Memory: "200MiB", PIDs: 77, Timeout: "5m",
		Env:     map[string]string{"FOO": "bar", "SSL_CERT_FILE": "/mine.pem"},
		Labels:  map[string]string{"task": "warm"},
		Network: &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test"}},
	})
	if createdWarm(t, d, cold.ID) {
		t.Fatalf("second create %s was claimed too: the pool holds one and refills only after creates", cold.ID)
	}

	for _, s := range []*client.Sandbox{sb, cold} {
		// cgroup v2 file names first, then v1's.
		for _, c := range []struct{ ctl, file, v1, want, want1 string }{
			{"memory", "memory.max", "memory.limit_in_bytes", strconv.Itoa(200 << 20), strconv.Itoa(200 << 20)},
			{"pids", "pids.max", "pids.max", "77", "77"},
			{"cpu", "cpu.max", "cpu.cfs_quota_us", "50000 100000", "50000"},
		} {
			p := d.CgroupFile(s.ID, c.ctl, c.file)
			if c.ctl == "pids" {
				// The workload's limit, below which the claim lowered it.
				p = d.WorkloadPidsFile(s.ID, c.file)
			}
			if p == "" {
				p, c.file, c.want = d.CgroupFile(s.ID, c.ctl, c.v1), c.v1, c.want1
			}
			if p == "" {
				t.Errorf("%s: no %s", s.ID, c.file)
				continue
			}
			b, err := os.ReadFile(p)
			if err != nil || strings.TrimSpace(string(b)) != c.want {
				t.Errorf("%s: %s = %q, %v; want %s", s.ID, c.file, b, err, c.want)
			}
		}
		got, err := d.Client.Get(ctx, s.ID)
		if err != nil || got.Labels["task"] != "warm" || got.Env["FOO"] != "bar" || got.PIDsLimit != 77 || got.MemoryBytes != 200<<20 {
			t.Errorf("%s: get = %+v, %v", s.ID, got, err)
		}
		out := MustRun(t, s, `echo "$FOO $SSL_CERT_FILE $BERTH_SANDBOX_ID $BERTH_TEMPLATE"`)
		if want := "bar /mine.pem " + s.ID + " minimal"; strings.TrimSpace(out) != want {
			t.Errorf("%s: env = %q, want %q", s.ID, out, want)
		}
	}
	// Nothing from the pool's life: the same processes and files as the
	// cold sandbox's (its agent alone, and no files).
	if w, c := MustRun(t, sb, leftovers), MustRun(t, cold, leftovers); w != c {
		t.Errorf("claimed sandbox holds\n%s\ncold one holds\n%s", w, c)
	}
	// The rlimits its processes inherit (RLIMIT_NPROC follows the pids
	// limit) are a cold sandbox's too.
	if w, c := MustRun(t, sb, "cat /proc/self/limits"), MustRun(t, cold, "cat /proc/self/limits"); w != c {
		t.Errorf("claimed sandbox's limits\n%s\ncold one's\n%s", w, c)
	}

	// The request's egress policy, applied at claim.
	env.install(t, sb)
	expect(t, sb, "https allowed.test"+testCA, 0, "host=allowed.test")
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "tcp "+ip1+":7", 1, "")

	// The pool refills behind the claims, and a default create (no
	// policy) claims the new one: egress none.
	waitWarm(t, d, "minimal", 1)
	plain := d.Create(t, client.CreateRequest{Template: "minimal"})
	if !createdWarm(t, d, plain.ID) {
		t.Fatalf("default create %s was not claimed", plain.ID)
	}
	env.install(t, plain)
	expect(t, plain, "https allowed.test"+testCA, 1, "")
	if p, err := d.Client.NetworkPolicy(ctx, plain.ID); err != nil || p.Mode != client.NetNone {
		t.Errorf("policy of a default claim = %+v, %v; want none", p, err)
	}
	// A create the pool cannot serve (another disk size) goes cold.
	waitWarm(t, d, "minimal", 1)
	odd := d.Create(t, client.CreateRequest{Template: "minimal", Disk: "300MiB"})
	if createdWarm(t, d, odd.ID) {
		t.Errorf("create with its own disk size %s was claimed from the pool", odd.ID)
	}
	if w := warmOf(t, d, "minimal"); w.Ready != 1 {
		t.Errorf("pool after a cold create = %+v, want it kept", w)
	}
	// Listing shows the four live sandboxes, never the pooled one.
	sbs, err := d.Local.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	want := []string{sb.ID, cold.ID, plain.ID, odd.ID}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("list = %v, want %v", ids, want)
	}
	// Cleanup destroys the sandboxes, stops the daemon (which drains the
	// pool) and checks nothing is left.
}

// A pool set at run time survives neither a daemon crash nor a clean stop:
// after SIGKILL the restarted daemon removes the pooled sandboxes it finds
// (no record owns them), and a stop drains the pool. A sudo-capable pool
// serves allow_sudo creates, and only them, without no_new_privs.
func TestWarmPoolCrashLeavesNothing(t *testing.T) {
	d := StartDaemon(t)
	if out, errOut, code := d.CLI(t, nil, "template", "warm", "minimal", "2"); code != 0 || !strings.Contains(out, "target 2") {
		t.Fatalf("template warm: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := d.CLI(t, nil, "template", "warm", "--", "minimal", "-1"); code == 0 || !strings.Contains(errOut, "target") {
		t.Errorf("template warm -1: exit %d, %q; want a target error", code, errOut)
	}
	if _, errOut, code := d.CLI(t, nil, "template", "warm", "nosuch", "1"); code == 0 || !strings.Contains(errOut, "nosuch") {
		t.Errorf("template warm nosuch: exit %d, %q; want not found", code, errOut)
	}
	waitWarm(t, d, "minimal", 2)
	if len(harness.Leaks(d)) == 0 {
		t.Fatal("a full pool shows nothing on the host: the leak check would not see one left behind")
	}
	d.Kill9()
	d.Start()
	if l := harness.Leaks(d); len(l) != 0 {
		t.Errorf("after SIGKILL and restart, left on the host: %v", l)
	}
	if w := warmOf(t, d, "minimal"); w != (client.WarmPool{}) {
		t.Errorf("warm after restart = %+v, want none (the target was set at run time)", w)
	}
	// Set again, then a clean stop (in cleanup) drains it.
	if _, err := d.Client.SetTemplateWarm(context.Background(), "minimal", 1); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, d, "minimal", 1)
	// Lowering the target destroys the surplus at once.
	if w, err := d.Client.SetTemplateWarm(context.Background(), "minimal", 0); err != nil || w.Ready != 0 {
		t.Errorf("warm 0 = %+v, %v", w, err)
	}
	if l := harness.Leaks(d); len(l) != 0 {
		t.Errorf("after warm 0, left on the host: %v", l)
	}
	if _, err := d.Client.SetTemplateWarm(context.Background(), "minimal", 1); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, d, "minimal", 1)

	// A sudo-capable pool beside it: allow_sudo creates claim from it,
	// and only they do.
	if out, errOut, code := d.CLI(t, nil, "template", "warm", "--allow-sudo", "minimal", "1"); code != 0 || !strings.Contains(out, "sudo warm pool target 1") {
		t.Fatalf("template warm --allow-sudo: %d %q %q", code, out, errOut)
	}
	waitWarmPool(t, d, "minimal", true, 1)
	if w := warmPoolOf(t, d, "minimal", true); w != (client.WarmPool{Target: 1, Ready: 1, AllowSudo: true}) {
		t.Errorf("sudo pool = %+v, want target 1, ready 1, allow_sudo", w)
	}
	if out, errOut, code := d.CLI(t, nil, "template", "ls"); code != 0 || !strings.Contains(out, "1/1, sudo 1/1") {
		t.Errorf("template ls: %d %q %q; want both pools in WARM", code, out, errOut)
	}
	nnp := func(sb *client.Sandbox) string {
		for l := range strings.Lines(MustRun(t, sb, "cat /proc/self/status")) {
			if v, ok := strings.CutPrefix(l, "NoNewPrivs:"); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("%s: no NoNewPrivs in /proc/self/status", sb.ID)
		return ""
	}
	plain := d.Create(t, client.CreateRequest{Template: "minimal"})
	if !createdWarm(t, d, plain.ID) || plain.AllowSudo || nnp(plain) != "1" {
		t.Errorf("plain create %s: warm %v, allow_sudo %v, NoNewPrivs %s; want a plain pooled one", plain.ID, createdWarm(t, d, plain.ID), plain.AllowSudo, nnp(plain))
	}
	if w := warmPoolOf(t, d, "minimal", true); w.Ready != 1 {
		t.Errorf("sudo pool after a plain create = %+v, want its one kept", w)
	}
	sudo := d.Create(t, client.CreateRequest{Template: "minimal", AllowSudo: new(true)})
	if !createdWarm(t, d, sudo.ID) || !sudo.AllowSudo || nnp(sudo) != "0" {
		t.Errorf("allow_sudo create %s: warm %v, allow_sudo %v, NoNewPrivs %s; want the sudo pool's, without no_new_privs", sudo.ID, createdWarm(t, d, sudo.ID), sudo.AllowSudo, nnp(sudo))
	}
	// Both refill; the clean stop drains both.
	waitWarm(t, d, "minimal", 1)
	waitWarmPool(t, d, "minimal", true, 1)
}
