package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// callAPI sends one request with optional headers and returns the status
// and body.
func callAPI(t *testing.T, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// newKey creates a key through the daemon's local socket.
func newKey(t *testing.T, d *Daemon, req client.CreateAPIKeyRequest) (*client.APIKey, *client.Client) {
	t.Helper()
	k, err := d.Local.CreateAPIKeyWith(t.Context(), req)
	if err != nil {
		t.Fatalf("create key %s: %v", req.Name, err)
	}
	c, err := client.New(d.URL, client.WithAPIKey(k.Key))
	if err != nil {
		t.Fatal(err)
	}
	return k, c
}

// errCode is the wire code of an error answer's body.
func errCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Code string `json:"code"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q is not the JSON error shape: %v", body, err)
	}
	return e.Code
}

// TestAuthKeysOnEveryAPI: with --require-auth, every route but health needs
// a key on both APIs; each key sees only its own sandboxes (404 for
// others'), an admin key and the local socket see all.
func TestAuthKeysOnEveryAPI(t *testing.T) {
	d := StartDaemon(t, "--require-auth")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	// The socket is root's alone.
	fi, err := os.Stat(strings.TrimPrefix(d.SocketURL, "unix://"))
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local socket: %v, mode %v; want a socket of mode 0600", err, fi.Mode())
	}

	// 401s, with the JSON error shape and a stable code.
	if st, body := callAPI(t, "GET", d.URL+"/v1/health", "", nil); st != 200 {
		t.Errorf("health without a key = %d %s, want 200", st, body)
	}
	for _, path := range []string{"/v1/sandboxes", "/v1/templates", "/v1/apikeys", "/v1/openapi.json"} {
		st, body := callAPI(t, "GET", d.URL+path, "", nil)
		if st != 401 || errCode(t, body) != errdefs.CodeUnauthenticated {
			t.Errorf("GET %s without a key = %d %s, want 401 unauthenticated", path, st, body)
		}
	}
	st, body := callAPI(t, "GET", d.URL+"/v1/sandboxes", "", map[string]string{"Authorization": "Bearer e2b_00000000000000000000000000000000000000aa"})
	if st != 401 || errCode(t, body) != errdefs.CodeUnauthenticated {
		t.Errorf("GET /v1/sandboxes with a bad key = %d %s, want 401 unauthenticated", st, body)
	}
	if st, body := callAPI(t, "GET", d.URL+"/v2/sandboxes", "", nil); st != 401 {
		t.Errorf("E2B list without a key = %d %s, want 401", st, body)
	}
	// The SDK's error class survives the wire.
	if _, err := d.Client.List(ctx, client.ListOptions{}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("SDK list without a key: %v, want unauthenticated", err)
	}

	keyA, ca := newKey(t, d, client.CreateAPIKeyRequest{Name: "alice"})
	keyB, cb := newKey(t, d, client.CreateAPIKeyRequest{Name: "bob"})
	_, cadmin := newKey(t, d, client.CreateAPIKeyRequest{Name: "ops", Admin: true})

	// Both headers authenticate.
	for _, h := range []map[string]string{{"Authorization": "Bearer " + keyA.Key}, {"X-API-Key": keyA.Key}} {
		if st, body := callAPI(t, "GET", d.URL+"/v1/sandboxes", "", h); st != 200 {
			t.Errorf("GET /v1/sandboxes with %v = %d %s", h, st, body)
		}
	}
	// A plain key manages no keys.
	if _, err := cb.ListAPIKeys(ctx); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("list keys with a plain key: %v, want permission_denied", err)
	}

	// alice's sandbox, made through the native API.
	sbA, err := ca.Create(ctx, client.CreateRequest{Template: "minimal"})
	if err != nil {
		t.Fatalf("alice create: %v", err)
	}
	if out := MustRun(t, sbA, "echo hi"); strings.TrimSpace(out) != "hi" {
		t.Errorf("alice exec = %q", out)
	}
	// bob's, made through the E2B API.
	st, body = callAPI(t, "POST", d.URL+"/sandboxes", `{"templateID":"minimal","timeout":300}`, map[string]string{"X-API-Key": keyB.Key, "Content-Type": "application/json"})
	if st != 201 {
		t.Fatalf("bob E2B create = %d %s", st, body)
	}
	var e2bSB struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal([]byte(body), &e2bSB); err != nil || e2bSB.SandboxID == "" {
		t.Fatalf("E2B create answer %s: %v", body, err)
	}
	idB := e2bSB.SandboxID

	// Cross-key: 404 on the native API, for every kind of route.
	for _, tc := range []struct {
		c  *client.Client
		id string
	}{{cb, sbA.ID}, {ca, idB}} {
		if _, err := tc.c.Get(ctx, tc.id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("get another key's sandbox %s: %v, want not_found", tc.id, err)
		}
		if err := tc.c.Kill(ctx, tc.id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("kill another key's sandbox %s: %v, want not_found", tc.id, err)
		}
		if _, err := tc.c.Sandbox(tc.id).Exec(ctx, client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("exec in another key's sandbox %s: %v, want not_found", tc.id, err)
		}
	}
	// …and on the E2B API.
	if st, body := callAPI(t, "GET", d.URL+"/sandboxes/"+sbA.ID, "", map[string]string{"X-API-Key": keyB.Key}); st != 404 {
		t.Errorf("bob E2B get of alice's sandbox = %d %s, want 404", st, body)
	}
	if st, body := callAPI(t, "DELETE", d.URL+"/sandboxes/"+idB, "", map[string]string{"X-API-Key": keyA.Key}); st != 404 {
		t.Errorf("alice E2B kill of bob's sandbox = %d %s, want 404", st, body)
	}
	// A key's own sandbox answers on both APIs, whichever made it.
	if st, body := callAPI(t, "GET", d.URL+"/sandboxes/"+sbA.ID, "", map[string]string{"X-API-Key": keyA.Key}); st != 200 {
		t.Errorf("alice E2B get of her native sandbox = %d %s, want 200", st, body)
	}
	if _, err := cb.Get(ctx, idB); err != nil {
		t.Errorf("bob native get of his E2B sandbox: %v", err)
	}
	// Listings are per key; the admin key and the socket list both.
	ids := func(c *client.Client) map[string]bool {
		t.Helper()
		sbs, err := c.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		m := map[string]bool{}
		for _, s := range sbs {
			m[s.ID] = true
		}
		return m
	}
	if got := ids(ca); !got[sbA.ID] || got[idB] {
		t.Errorf("alice lists %v, want her sandbox only", got)
	}
	if got := ids(cb); got[sbA.ID] || !got[idB] {
		t.Errorf("bob lists %v, want his sandbox only", got)
	}
	for name, c := range map[string]*client.Client{"admin key": cadmin, "socket": d.Local} {
		if got := ids(c); !got[sbA.ID] || !got[idB] {
			t.Errorf("%s lists %v, want both", name, got)
		}
	}
	if st, body := callAPI(t, "GET", d.URL+"/v2/sandboxes", "", map[string]string{"X-API-Key": keyA.Key}); st != 200 || strings.Contains(body, idB) || !strings.Contains(body, sbA.ID) {
		t.Errorf("alice E2B list = %d %s, want her sandbox only", st, body)
	}

	// The CLI: the key from BERTH_API_KEY or --api-key; unix:// URLs.
	out, errOut, code := d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.URL, "BERTH_API_KEY=" + keyA.Key}, "ls")
	if code != 0 || !strings.Contains(out, sbA.ID) || strings.Contains(out, idB) {
		t.Errorf("berth ls with alice's key = %q %q %d", out, errOut, code)
	}
	out, errOut, code = d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.URL}, "--api-key", keyB.Key, "ls")
	if code != 0 || strings.Contains(out, sbA.ID) || !strings.Contains(out, idB) {
		t.Errorf("berth --api-key bob ls = %q %q %d", out, errOut, code)
	}
	_, errOut, code = d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.URL}, "ls")
	if code == 0 || !strings.Contains(errOut, "(unauthenticated)") {
		t.Errorf("berth ls without a key = %q %d, want unauthenticated", errOut, code)
	}
	out, errOut, code = d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.SocketURL}, "exec", idB, "--", "echo", "via-socket")
	if code != 0 || strings.TrimSpace(out) != "via-socket" {
		t.Errorf("berth exec over the socket = %q %q %d", out, errOut, code)
	}
}

// TestAuthRefusesOpenListen: a daemon listening beyond loopback without
// --require-auth does not start, and says what to do.
func TestAuthRefusesOpenListen(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Berth, "serve", "--listen", "0.0.0.0:0", "--data-dir", filepath.Join(dir, "data"), "--agent", bin.Agent)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "--require-auth") || !strings.Contains(string(out), "failed_precondition") {
		t.Fatalf("serve --listen 0.0.0.0:0 = %v\n%s\nwant a refusal naming --require-auth", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("the refused daemon made its data dir: %v", err)
	}
}

// TestQuotaConcurrentCreates: a key's max-sandboxes holds under concurrent
// creates on both APIs (no over-admission), the refusal is
// resource_exhausted naming the quota and the use, and raising the quota
// later admits more.
func TestQuotaConcurrentCreates(t *testing.T) {
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, errOut, code := d.CLI(t, nil, "apikey", "create", "--name", "capped", "--max-sandboxes", "2", "--max-memory", "1G")
	if code != 0 {
		t.Fatalf("apikey create: %s", errOut)
	}
	key := strings.TrimSpace(out)
	c, err := client.New(d.URL, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok       []string
		refusals []error
	)
	for range n {
		wg.Go(func() {
			sb, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refusals = append(refusals, err)
				return
			}
			ok = append(ok, sb.ID)
		})
	}
	wg.Wait()
	if len(ok) != 2 || len(refusals) != n-2 {
		t.Fatalf("%d concurrent creates under max-sandboxes 2: %d made, refusals %v", n, len(ok), refusals)
	}
	for _, err := range refusals {
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 2") || !strings.Contains(err.Error(), "2 sandboxes in use") {
			t.Errorf("refusal %v: want resource_exhausted naming max-sandboxes 2 and 2 in use", err)
		}
	}
	// The E2B API enforces the same quota, with HTTP 429.
	st, body := callAPI(t, "POST", d.URL+"/sandboxes", `{"templateID":"minimal"}`, map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
	if st != 429 || !strings.Contains(body, "max-sandboxes") {
		t.Errorf("E2B create past the quota = %d %s, want 429 naming max-sandboxes", st, body)
	}
	// Memory: 2×128M in use; 1G would exceed max-memory 1G once a slot
	// is free.
	if _, _, code := d.CLI(t, nil, "apikey", "update", keyIDByName(t, d, "capped"), "--max-sandboxes", "3"); code != 0 {
		t.Fatal("apikey update failed")
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "1G"}); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory") {
		t.Errorf("create past max-memory: %v, want resource_exhausted naming max-memory", err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M"})
	if err != nil {
		t.Fatalf("create after raising the quota: %v", err)
	}
	ok = append(ok, sb.ID)
	// A killed sandbox frees its slot.
	if err := c.Kill(ctx, ok[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M"}); err != nil {
		t.Errorf("create after a kill freed a slot: %v", err)
	}
}

// keyIDByName finds a key's ID in `berth apikey ls`.
func keyIDByName(t *testing.T, d *Daemon, name string) string {
	t.Helper()
	return keyID(t, d, name)
}

// TestRecords: ls shows live sandboxes and --all the ended ones; kill is
// idempotent, takes several IDs, --label and --all; rm removes an ended
// sandbox's record and logs now and refuses a live one; the retention
// removes ended records with their logs on its own.
func TestRecords(t *testing.T) {
	d := StartDaemon(t, "--retention", "30s")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	mk := func(labels map[string]string) string {
		return d.Create(t, client.CreateRequest{Labels: labels}).ID
	}
	a, b, c1, c2, keep := mk(nil), mk(nil), mk(map[string]string{"batch": "x"}), mk(map[string]string{"batch": "x"}), mk(nil)
	// Logs exist for a sandbox that did something.
	MustRun(t, d.Client.Sandbox(a), "true")

	if _, errOut, code := d.CLI(t, nil, "rm", a); code == 0 || !strings.Contains(errOut, "failed_precondition") {
		t.Errorf("rm of a live sandbox = %d %q, want failed_precondition", code, errOut)
	}
	out, errOut, code := d.CLI(t, nil, "kill", a, b)
	if code != 0 || out != a+"\n"+b+"\n" {
		t.Errorf("kill a b = %d %q %q", code, out, errOut)
	}
	// Again: already stopped is done.
	if out, errOut, code := d.CLI(t, nil, "kill", a); code != 0 || out != a+"\n" {
		t.Errorf("kill of a stopped sandbox = %d %q %q, want exit 0", code, out, errOut)
	}
	out, _, code = d.CLI(t, nil, "kill", "--label", "batch=x")
	if code != 0 || !strings.Contains(out, c1) || !strings.Contains(out, c2) || strings.Contains(out, keep) {
		t.Errorf("kill --label batch=x = %d %q", code, out)
	}
	out, _, _ = d.CLI(t, nil, "ls")
	if strings.Contains(out, a) || strings.Contains(out, c1) || !strings.Contains(out, keep) {
		t.Errorf("ls shows ended sandboxes or misses a live one:\n%s", out)
	}
	out, _, _ = d.CLI(t, nil, "ls", "--all")
	if !strings.Contains(out, a) || !strings.Contains(out, keep) {
		t.Errorf("ls --all misses sandboxes:\n%s", out)
	}
	if out, errOut, code := d.CLI(t, nil, "kill", "--all"); code != 0 || out != keep+"\n" {
		t.Errorf("kill --all = %d %q %q, want the one live sandbox", code, out, errOut)
	}

	// rm now: the record and its logs are gone.
	wl := filepath.Join(d.DataDir, "worklog", a+".jsonl")
	if _, err := os.Stat(wl); err != nil {
		t.Fatalf("sandbox %s has no work log to remove: %v", a, err)
	}
	if out, errOut, code := d.CLI(t, nil, "rm", a); code != 0 || out != a+"\n" {
		t.Errorf("rm = %d %q %q", code, out, errOut)
	}
	if _, err := d.Client.Get(ctx, a); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after rm: %v, want not_found", err)
	}
	if _, err := os.Stat(wl); !os.IsNotExist(err) {
		t.Errorf("work log after rm: %v, want it gone", err)
	}
	// The retention removes the others on its own.
	waitFor(t, 2*time.Minute, "ended records to expire", func() bool {
		sbs, err := d.Client.List(ctx, client.ListOptions{})
		return err == nil && len(sbs) == 0
	})
	for _, id := range []string{b, c1, c2, keep} {
		if _, err := d.Client.Events(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("events of expired %s: %v, want not_found", id, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(d.DataDir, "audit"))
	for _, e := range ents {
		t.Errorf("audit file %s survived its sandbox's record", e.Name())
	}
}

// cgroupCPU is the CPU time a sandbox's cgroup accounted, read from the
// kernel: cpuacct.usage on cgroup v1, cpu.stat usage_usec on v2.
func cgroupCPU(t *testing.T, d *Daemon, id string) time.Duration {
	t.Helper()
	if p := d.CgroupFile(id, "cpuacct", "cpuacct.usage"); p != "" {
		ns, err := harnessCgroupInt(p)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ns)
	}
	if p := d.CgroupFile(id, "cpu", "cpuacct.usage"); p != "" {
		ns, err := harnessCgroupInt(p)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ns)
	}
	p := d.CgroupFile(id, "cpu", "cpu.stat")
	if p == "" {
		t.Fatalf("sandbox %s has no CPU accounting cgroup file", id)
	}
	us, err := harnessCgroupKV(p, "usage_usec")
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond
}

// usageOf returns the record of key (by name) or sandbox in a usage list.
func usageOf(us []client.UsageRecord, match func(client.UsageRecord) bool) (client.UsageRecord, bool) {
	for _, u := range us {
		if match(u) {
			return u, true
		}
	}
	return client.UsageRecord{}, false
}

// TestUsageAttributed: a CPU spin's CPU-seconds land on its key (as the
// cgroup accounted them) and not on another key's; usage outlives the
// sandbox and a daemon restart; the CLI prints it as JSON.
func TestUsageAttributed(t *testing.T) {
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	_, ca := newKey(t, d, client.CreateAPIKeyRequest{Name: "spinner"})
	_, cb := newKey(t, d, client.CreateAPIKeyRequest{Name: "idler"})
	sa, err := ca.Create(ctx, client.CreateRequest{Template: "minimal", CPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cb.Create(ctx, client.CreateRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has accounted 2 CPU-seconds to the sandbox
	// (however busy the host), then stop; what it got is what the cgroup
	// says.
	pid, err := sa.Start(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "while :; do :; done"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the spin to use 2 CPU-seconds", func() bool { return cgroupCPU(t, d, sa.ID) >= 2*time.Second })
	if err := sa.Signal(ctx, pid, 9); err != nil {
		t.Fatal(err)
	}
	MustRun(t, sa, "true") // the agent answers: the spin is gone
	spun := cgroupCPU(t, d, sa.ID)
	// The monitor meters it: wait until the key's usage covers what the
	// cgroup accounted, then check it did not invent more.
	var got client.UsageRecord
	waitFor(t, 60*time.Second, "the spin's CPU on its key", func() bool {
		us, err := d.Local.Usage(ctx, client.UsageOptions{By: "key"})
		if err != nil {
			t.Fatal(err)
		}
		got, _ = usageOf(us, func(u client.UsageRecord) bool { return u.Key == "spinner" })
		return got.CPUSeconds >= spun.Seconds()
	})
	if now := cgroupCPU(t, d, sa.ID); got.CPUSeconds > now.Seconds() {
		t.Errorf("key spinner: %.3f CPU-seconds, more than its cgroup accounted (%.3f)", got.CPUSeconds, now.Seconds())
	}
	if got.Sandboxes != 1 || got.MemoryGiBSeconds <= 0 || got.MemoryPeakBytes <= 0 || got.SandboxSeconds <= 0 {
		t.Errorf("key spinner usage %+v: want 1 sandbox and memory, peak and time metered", got)
	}
	// The other key: only its own idle sandbox, not the spin.
	us, err := cb.Usage(ctx, client.UsageOptions{By: "key"})
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 1 || us[0].Key != "idler" {
		t.Fatalf("idler sees usage %+v, want its own only", us)
	}
	if idle := cgroupCPU(t, d, sb.ID); us[0].CPUSeconds > idle.Seconds() || us[0].CPUSeconds >= spun.Seconds()/2 {
		t.Errorf("key idler: %.3f CPU-seconds (its cgroup: %.3f, the spin: %.3f)", us[0].CPUSeconds, idle.Seconds(), spun.Seconds())
	}

	// Its usage over time: a point recorded after the spin holds all of
	// its CPU, and the points where CPU was used show a share of the
	// sandbox's one CPU; another key does not see them.
	var pts []client.MetricSample
	waitFor(t, 2*time.Minute, "a recorded point holding the spin's CPU", func() bool {
		pts, err = ca.Metrics(ctx, sa.ID, client.MetricsOptions{Until: time.Now().Add(-time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		return len(pts) > 0 && pts[len(pts)-1].CPUSeconds >= spun.Seconds()
	})
	busy := 0
	for i, m := range pts {
		if m.CPUs != 1 || m.CPUPercent < 0 || m.CPUPercent > 100 || m.MemoryBytes <= 0 || m.MemoryLimitBytes <= 0 || m.DiskBytes <= 0 {
			t.Errorf("point %d = %+v", i, m)
		}
		if i > 0 && m.CPUSeconds > pts[i-1].CPUSeconds+0.1 {
			busy++
			if m.CPUPercent <= 0 || !m.Time.After(pts[i-1].Time) {
				t.Errorf("point %d used %.3f CPU-seconds since the one before but shows %.1f %%: %+v", i, m.CPUSeconds-pts[i-1].CPUSeconds, m.CPUPercent, pts)
			}
		}
	}
	if busy == 0 && pts[0].CPUPercent <= 0 {
		t.Errorf("no point shows the spin: %+v", pts)
	}
	now, err := ca.Metrics(ctx, sa.ID, client.MetricsOptions{Since: pts[len(pts)-1].Time.Add(time.Nanosecond)})
	if err != nil || len(now) == 0 || now[len(now)-1].CPUSeconds > cgroupCPU(t, d, sa.ID).Seconds() {
		t.Errorf("readings after the last point = %+v, %v: want one taken now, within the cgroup's CPU", now, err)
	}
	if _, err := cb.Metrics(ctx, sa.ID, client.MetricsOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's metrics: %v, want not_found", err)
	}
	_, err = ca.Metrics(ctx, sa.ID, client.MetricsOptions{Since: time.Now(), Until: time.Now().Add(-time.Hour)})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Body(err).Field != "until" {
		t.Errorf("until before since: %v, want invalid_argument on until", err)
	}
	out, errOut, code := d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.SocketURL}, "metrics", sa.ID, "-o", "json")
	var cliPts []client.MetricSample
	if code != 0 || json.Unmarshal([]byte(out), &cliPts) != nil || len(cliPts) < len(pts) {
		t.Errorf("berth metrics -o json = %d %q %q", code, out, errOut)
	}
	if out, errOut, code := d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.SocketURL}, "metrics", sa.ID, "--since", "soon"); code == 0 || !strings.Contains(errOut, "--since") {
		t.Errorf("berth metrics --since soon = %d %q %q, want an error naming --since", code, out, errOut)
	}

	// Kept after the sandbox is gone, and across a restart.
	if err := ca.Kill(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	d.Start()
	us, err = d.Local.Usage(ctx, client.UsageOptions{By: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := usageOf(us, func(u client.UsageRecord) bool { return u.Sandbox == sa.ID })
	if !ok || rec.Key != "spinner" || rec.CPUSeconds < spun.Seconds() {
		t.Errorf("after kill and restart, sandbox %s usage %+v (ok %v), want its %.3f CPU-seconds on spinner", sa.ID, rec, ok, spun.Seconds())
	}
	out, errOut, code = d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.SocketURL}, "usage", "--by", "key", "-o", "json")
	var doc struct {
		Usage []struct {
			Key        string  `json:"key"`
			CPUSeconds float64 `json:"cpu_seconds"`
		} `json:"usage"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("berth usage -o json = %d %q %q", code, out, errOut)
	}
	found := false
	for _, u := range doc.Usage {
		if u.Key == "spinner" && u.CPUSeconds >= spun.Seconds() {
			found = true
		}
	}
	if !found {
		t.Errorf("berth usage -o json has no spinner with %.3f CPU-seconds:\n%s", spun.Seconds(), out)
	}
}

var (
	harnessCgroupInt = harness.CgroupInt
	harnessCgroupKV  = harness.CgroupKV
)

// TestMetrics: /metrics is authenticated (admin), and what it serves
// parses with Prometheus' own text parser and carries Berth's metrics.
func TestMetrics(t *testing.T) {
	d := StartDaemon(t, "--require-auth")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if st, body := callAPI(t, "GET", d.URL+"/metrics", "", nil); st != 401 || errCode(t, body) != errdefs.CodeUnauthenticated {
		t.Errorf("/metrics without a key = %d %s, want 401", st, body)
	}
	key, c := newKey(t, d, client.CreateAPIKeyRequest{Name: "worker"})
	if st, body := callAPI(t, "GET", d.URL+"/metrics", "", map[string]string{"Authorization": "Bearer " + key.Key}); st != 403 {
		t.Errorf("/metrics with a plain key = %d %s, want 403", st, body)
	}
	admin, _ := newKey(t, d, client.CreateAPIKeyRequest{Name: "prometheus", Admin: true})
	sb, err := c.Create(ctx, client.CreateRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	MustRun(t, sb, "true")
	waitFor(t, 60*time.Second, "the key's CPU to be metered", func() bool {
		us, err := d.Local.Usage(ctx, client.UsageOptions{})
		return err == nil && len(us) > 0 && us[0].CPUSeconds > 0
	})
	st, body := callAPI(t, "GET", d.URL+"/metrics", "", map[string]string{"Authorization": "Bearer " + admin.Key})
	if st != 200 {
		t.Fatalf("/metrics with an admin key = %d %s", st, body)
	}
	// Strict names: every metric Berth exports is a legacy Prometheus name.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	value := func(name string, labels map[string]string) (float64, bool) {
		f, ok := fams[name]
		if !ok {
			return 0, false
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
		return 0, false
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"berth_sandboxes", map[string]string{"state": "ready"}, 1},
		{"berth_sandbox_create_seconds", map[string]string{"result": "ok"}, 1},
		{"berth_execs_total", nil, 1},
		{"berth_egress_decisions_total", map[string]string{"decision": "deny"}, 0},
		{"berth_key_cpu_seconds_total", map[string]string{"key": "worker"}, 1e-9},
		{"go_goroutines", nil, 1},
		{"process_resident_memory_bytes", nil, 1},
	} {
		v, ok := value(c.name, c.labels)
		if !ok || v < c.min {
			t.Errorf("%s%v = %v (present %v), want at least %v", c.name, c.labels, v, ok, c.min)
		}
	}
}
