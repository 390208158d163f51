package e2e

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// TestQuotaCountsRunningSandboxes: a key's CPU and memory bounds count
// its running sandboxes, so a key parks more than it may run; its
// max-sandboxes counts parked ones too (each holds a disk and a uid range
// on the host). Paused ones free their memory for creates; a resume is
// admitted as a create is and refused the same way (resource_exhausted
// on the native API, the CLI, an auto-resuming exec and E2B's connect),
// the sandbox staying paused with its files; concurrent resumes never
// take more than there is; a raised quota or a killed sandbox lets the
// resume through.
func TestQuotaCountsRunningSandboxes(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	k, c := newKey(t, d, client.CreateAPIKeyRequest{Name: "parker", Quota: &client.Quota{MaxSandboxes: 4, MaxMemory: "256M"}})
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
	if _, err := create(false); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory") {
		t.Fatalf("third create of 128M while 256M run: %v, want resource_exhausted naming max-memory", err)
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
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory 256M") || !strings.Contains(err.Error(), "256M in use") {
			t.Errorf("%s past the quota: %v, want resource_exhausted naming max-memory 256M and 256M in use", what, err)
		}
	}
	_, err := c.Resume(ctx, parked[1].ID, 0)
	wantRefusal("resume", err)
	_, err = parked[0].Exec(ctx, client.ExecRequest{Cmd: "/bin/true"})
	wantRefusal("auto-resuming exec", err)
	if _, stderr, code := d.CLIEnv(t, nil, []string{"BERTH_URL=" + d.URL, "BERTH_API_KEY=" + k.Key}, "resume", parked[1].ID); code == 0 || !strings.Contains(stderr, "max-memory") || !strings.Contains(stderr, "resource_exhausted") {
		t.Errorf("berth resume past the quota: exit %d, stderr %q; want non-zero naming max-memory and resource_exhausted", code, stderr)
	}
	st, body := callAPI(t, "POST", d.URL+"/sandboxes/"+parked[1].ID+"/connect", `{"timeout":300}`, map[string]string{"X-API-Key": k.Key, "Content-Type": "application/json"})
	if st != 429 || !strings.Contains(body, "max-memory") {
		t.Errorf("E2B connect past the quota = %d %s, want 429 naming max-memory", st, body)
	}
	assertPaused("after the refused resumes")
	// Room for one freed: of two resumes at once, one gets it.
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
		t.Fatalf("two resumes for room for one: resumed %v, refused %v; want one each", resumed, refused)
	}
	wantRefusal("the second resume", refused[0])
	// max-sandboxes counts parked ones: with one of the three live
	// paused and 128M running, one more is made and then none.
	if _, err := c.Pause(ctx, running[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := create(false); err != nil {
		t.Fatalf("a fourth live sandbox under max-sandboxes 4: %v", err)
	}
	if _, err := create(false); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 4") {
		t.Errorf("a fifth, two of the four paused: %v, want resource_exhausted naming max-sandboxes 4", err)
	}
	// A raised quota lets the paused ones through, with their files.
	if _, _, code := d.CLI(t, nil, "apikey", "update", k.ID, "--max-memory", "1G"); code != 0 {
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
}

// TestPauseResumeByLabel: the CLI parks a fleet by label and wakes it the
// same way, several at a time: each sandbox once, only those selected,
// each with its own files; a resume past the key's quota is reported
// with the others done, and the exit code says so.
func TestPauseResumeByLabel(t *testing.T) {
	d := StartDaemon(t)
	ctx := t.Context()
	k, c := newKey(t, d, client.CreateAPIKeyRequest{Name: "fleet", Quota: &client.Quota{MaxMemory: "512M"}})
	env := []string{"BERTH_URL=" + d.URL, "BERTH_API_KEY=" + k.Key}
	var fleet []string
	for range 3 {
		sb, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M", Labels: map[string]string{"fleet": "night"}})
		if err != nil {
			t.Fatal(err)
		}
		MustRun(t, sb, "echo "+sb.ID+" > /home/mine")
		fleet = append(fleet, sb.ID)
	}
	other, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M"})
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
	// 384M free: two more of 128M run, so only one of the three fits.
	for range 2 {
		if _, err := c.Create(ctx, client.CreateRequest{Template: "minimal", Memory: "128M"}); err != nil {
			t.Fatal(err)
		}
	}
	out, stderr, code = d.CLIEnv(t, nil, env, "resume", "--label", "fleet=night")
	if code == 0 || strings.Count(out, " resumed, expires at ") != 1 || strings.Count(stderr, "max-memory 512M exceeded") != 2 {
		t.Errorf("resume --label past the quota = %d, out %q, stderr %q; want non-zero, one resumed, two refusals naming the quota", code, out, stderr)
	}
	if err := c.Kill(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	// The two left paused come back once there is room: one now, one
	// refused; --all sees only paused ones.
	out, stderr, code = d.CLIEnv(t, nil, env, "resume", "--all")
	if code == 0 || strings.Count(out, " resumed, expires at ") != 1 || strings.Count(stderr, "max-memory 512M exceeded") != 1 {
		t.Errorf("resume --all with one place = %d, out %q, stderr %q", code, out, stderr)
	}
	if _, _, code := d.CLI(t, nil, "apikey", "update", k.ID, "--max-memory", "0"); code != 0 {
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
