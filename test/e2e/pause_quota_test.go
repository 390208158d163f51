package e2e

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// TestQuotaCountsRunningSandboxes: a key's quota bounds what its running
// sandboxes hold, so a key parks more sandboxes than it may run. Paused
// ones free their place for creates; a resume is admitted as a create is
// and refused the same way (resource_exhausted on the native API, the
// CLI, an auto-resuming exec and E2B's connect), the sandbox staying
// paused with its files; concurrent resumes never take more places than
// there are; a raised quota or a killed sandbox lets the resume through.
func TestQuotaCountsRunningSandboxes(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	k, c := newKey(t, d, client.CreateAPIKeyRequest{Name: "parker", Quota: &client.Quota{MaxSandboxes: 2, MaxMemory: "512M"}})
	key := k.Key
	create := func(autoResume bool) (*client.Sandbox, error) {
		return c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M", AutoResume: autoResume})
	}
	var parked []*client.Sandbox
	for i := range 2 {
		sb, err := create(i == 0)
		if err != nil {
			t.Fatal(err)
		}
		MustRun(t, sb, "echo "+sb.ID+" > /home/mine")
		parked = append(parked, sb)
	}
	if _, err := create(false); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 2") {
		t.Fatalf("third create while two run: %v, want resource_exhausted naming max-sandboxes 2", err)
	}
	for _, sb := range parked {
		if p, err := c.Pause(ctx, sb.ID); err != nil || p.State != client.StatePaused {
			t.Fatalf("pause %s: %+v, %v", sb.ID, p, err)
		}
	}
	// Both parked: two more run.
	var running []*client.Sandbox
	for range 2 {
		sb, err := create(false)
		if err != nil {
			t.Fatalf("create while the key's other sandboxes are paused: %v", err)
		}
		running = append(running, sb)
	}
	assertPaused := func(when string) {
		t.Helper()
		for _, sb := range parked {
			got, err := c.Get(ctx, sb.ID)
			if err != nil || got.State != client.StatePaused {
				t.Fatalf("%s: %s is %+v, %v; want paused", when, sb.ID, got, err)
			}
		}
	}
	// Every way of resuming is refused while two run, and changes nothing.
	wantRefusal := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 2") || !strings.Contains(err.Error(), "2 sandboxes in use") {
			t.Errorf("%s past the quota: %v, want resource_exhausted naming max-sandboxes 2 and 2 in use", what, err)
		}
	}
	_, err := c.Resume(ctx, parked[1].ID, 0)
	wantRefusal("resume", err)
	_, err = parked[0].Exec(ctx, client.ExecRequest{Cmd: "/bin/true"})
	wantRefusal("auto-resuming exec", err)
	if _, stderr, code := d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.URL, "BERTH_API_KEY=" + key}, "resume", parked[1].ID); code == 0 || !strings.Contains(stderr, "max-sandboxes 2") || !strings.Contains(stderr, "resource_exhausted") {
		t.Errorf("berth resume past the quota: exit %d, stderr %q; want non-zero naming max-sandboxes and resource_exhausted", code, stderr)
	}
	st, body := callAPI(t, "POST", d.URL+"/sandboxes/"+parked[1].ID+"/connect", `{"timeout":300}`, map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
	if st != 429 || !strings.Contains(body, "max-sandboxes") {
		t.Errorf("E2B connect past the quota = %d %s, want 429 naming max-sandboxes", st, body)
	}
	assertPaused("after the refused resumes")
	// A place freed: of two resumes at once, one gets it.
	if err := c.Kill(ctx, running[0].ID); err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		resumed []string
		refused []error
	)
	for _, sb := range parked {
		wg.Go(func() {
			_, err := c.Resume(ctx, sb.ID, 0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			resumed = append(resumed, sb.ID)
		})
	}
	wg.Wait()
	if len(resumed) != 1 || len(refused) != 1 {
		t.Fatalf("two resumes for one free place: resumed %v, refused %v; want one each", resumed, refused)
	}
	wantRefusal("the second resume", refused[0])
	// A raised quota lets the other through, with its files.
	if _, _, code := d.CLI(t, nil, "apikey", "update", k.ID, "--max-sandboxes", "3"); code != 0 {
		t.Fatal("apikey update failed")
	}
	for _, sb := range parked {
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatalf("resume %s under the raised quota: %v", sb.ID, err)
		}
		if got := strings.TrimSpace(MustRun(t, c.Sandbox(sb.ID), "cat /home/mine")); got != sb.ID {
			t.Errorf("%s after its resume has /home/mine %q, want its own ID", sb.ID, got)
		}
	}
	// The memory bound counts running sandboxes alone too: with one of
	// the three 128M ones paused again, a 256M create fits in 512M, and
	// then the paused one's resume does not, whatever the count allows.
	if _, err := c.Pause(ctx, parked[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "256M"}); err != nil {
		t.Fatalf("create of 256M with 256M running under max-memory 512M: %v", err)
	}
	if _, _, code := d.CLI(t, nil, "apikey", "update", k.ID, "--max-sandboxes", "10"); code != 0 {
		t.Fatal("apikey update failed")
	}
	_, err = c.Resume(ctx, parked[0].ID, 0)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory") {
		t.Errorf("resume of 128M with 512M running under max-memory 512M: %v, want resource_exhausted naming max-memory", err)
	}
	if got, err := c.Get(ctx, parked[0].ID); err != nil || got.State != client.StatePaused {
		t.Errorf("after the refused resume: %+v, %v; want paused", got, err)
	}
}

// TestPauseResumeByLabel: the CLI parks a fleet by label and wakes it the
// same way, several at a time: each sandbox once, only those selected,
// each with its own files; a resume past the key's quota is reported
// with the others done, and the exit code says so.
func TestPauseResumeByLabel(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	k, c := newKey(t, d, client.CreateAPIKeyRequest{Name: "fleet", Quota: &client.Quota{MaxSandboxes: 4}})
	env := []string{"BERTH_URL=" + d.URL, "BERTH_API_KEY=" + k.Key}
	var fleet []string
	for range 3 {
		sb, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Labels: map[string]string{"fleet": "night"}})
		if err != nil {
			t.Fatal(err)
		}
		MustRun(t, sb, "echo "+sb.ID+" > /home/mine")
		fleet = append(fleet, sb.ID)
	}
	other, err := c.Create(ctx, client.CreateRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, code := d.CLIEnv(t, nil, env, "pause", "--label", "fleet=night", "--parallel", "2")
	if code != 0 || strings.Count(out, " paused (filesystem)") != 3 {
		t.Fatalf("pause --label = %d, out %q, stderr %q; want three paused", code, out, stderr)
	}
	for _, id := range fleet {
		if got, err := c.Get(ctx, id); err != nil || got.State != client.StatePaused {
			t.Errorf("%s after pause --label: %+v, %v; want paused", id, got, err)
		}
	}
	if got, err := c.Get(ctx, other.ID); err != nil || got.State != client.StateReady {
		t.Errorf("the sandbox without the label: %+v, %v; want ready", got, err)
	}
	// Three places free: two more run, so one of the three cannot.
	for range 2 {
		if _, err := c.Create(ctx, client.CreateRequest{Template: "minimal"}); err != nil {
			t.Fatal(err)
		}
	}
	out, stderr, code = d.CLIEnv(t, nil, env, "resume", "--label", "fleet=night")
	if code == 0 || strings.Count(out, " resumed, expires at ") != 1 || strings.Count(stderr, "max-sandboxes 4 reached") != 2 {
		t.Errorf("resume --label past the quota = %d, out %q, stderr %q; want non-zero, one resumed, two refusals naming the quota", code, out, stderr)
	}
	if err := c.Kill(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	// The two left paused come back once there is room: one now, one
	// refused; --all sees only paused ones.
	out, stderr, code = d.CLIEnv(t, nil, env, "resume", "--all")
	if code == 0 || strings.Count(out, " resumed, expires at ") != 1 || strings.Count(stderr, "max-sandboxes 4 reached") != 1 {
		t.Errorf("resume --all with one place = %d, out %q, stderr %q", code, out, stderr)
	}
	if _, _, code := d.CLI(t, nil, "apikey", "update", k.ID, "--max-sandboxes", "0"); code != 0 {
		t.Fatal("apikey update failed")
	}
	if out, stderr, code = d.CLIEnv(t, nil, env, "resume", "--all"); code != 0 || strings.Count(out, " resumed, expires at ") != 1 {
		t.Errorf("resume --all unbounded = %d, out %q, stderr %q; want the last one", code, out, stderr)
	}
	for _, id := range fleet {
		if got := strings.TrimSpace(MustRun(t, c.Sandbox(id), "cat /home/mine")); got != id {
			t.Errorf("%s after the resumes has /home/mine %q", id, got)
		}
	}
}
