package hostile

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestDaemonFaults kills the daemon with SIGKILL in the middle of create,
// exec, file upload and destroy, restarts it, and checks that the
// neighbour kept its data and its processes, and (when the test ends,
// through the harness) that nothing leaked on the host.
func TestDaemonFaults(t *testing.T) {
	l := newLab(t, client.CreateRequest{})
	d := l.d
	restart := func(t *testing.T) {
		t.Helper()
		d.Kill9()
		d.Start()
		// The neighbour was re-adopted with its files and processes.
		sb, err := d.Client.Get(t.Context(), l.nb.ID)
		if err != nil || sb.State != client.StateReady {
			t.Fatalf("neighbour after restart: %+v, %v", sb, err)
		}
		if o := harness.MustRun(t, l.nb, "ps -o args | grep -c '[n]eighbour-sleeper'"); strings.TrimSpace(o) != "1" {
			t.Errorf("neighbour's background process is gone after the restart")
		}
		l.check(t)
	}
	sandboxDirs := func() int {
		ents, _ := os.ReadDir(filepath.Join(d.DataDir, "sandboxes"))
		return len(ents)
	}

	t.Run("kill-during-create", func(t *testing.T) {
		before := sandboxDirs()
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
			errc <- err
		}()
		harness.WaitFor(t, time.Minute, "the create to start", func() bool { return sandboxDirs() > before })
		restart(t)
		t.Logf("interrupted create returned: %v", <-errc)
		// The half-made sandbox is not left ready-looking.
		sbs, err := d.Client.List(t.Context(), client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if sb.ID != l.nb.ID && sb.ID != l.sb.ID && sb.State == client.StateCreating {
				t.Errorf("sandbox %s still creating after restart", sb.ID)
			}
		}
	})

	t.Run("kill-during-exec", func(t *testing.T) {
		errc := make(chan error, 1)
		started := harness.NewFirstOutput()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := l.sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "echo started; sleep 30"}, Stdout: started})
			errc <- err
		}()
		// The command's first output is the event that it runs.
		select {
		case <-started.C:
		case err := <-errc:
			t.Fatalf("exec ended before it printed: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("the exec printed nothing within 2 minutes")
		}
		restart(t)
		if err := <-errc; err == nil {
			t.Errorf("exec through a killed daemon reported success")
		}
		harness.MustRun(t, l.sb, "true")
	})

	t.Run("kill-during-upload", func(t *testing.T) {
		pr, pw := io.Pipe()
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errc <- l.sb.WriteFile(ctx, "/tmp/upload", pr)
		}()
		chunk := bytes.Repeat([]byte("u"), 1<<20)
		for i := 0; i < 4; i++ {
			if _, err := pw.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		restart(t)
		pw.Close()
		if err := <-errc; err == nil {
			t.Errorf("upload through a killed daemon reported success")
		}
		harness.MustRun(t, l.sb, "ls -l /tmp/upload; true")
	})

	t.Run("kill-during-destroy", func(t *testing.T) {
		victim := d.Create(t, client.CreateRequest{})
		harness.MustRun(t, victim, "(sleep 12345 &) ; echo data > /tmp/f")
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errc <- victim.Kill(ctx)
		}()
		harness.WaitFor(t, time.Minute, "the destroy to start", func() bool {
			sb, err := d.Client.Get(context.Background(), victim.ID)
			return err != nil || sb.State != client.StateReady
		})
		restart(t)
		t.Logf("interrupted destroy returned: %v", <-errc)
		// Whatever state the restart found, a destroy now finishes it.
		_ = victim.Kill(t.Context())
		harness.WaitFor(t, 2*time.Minute, "the victim's cgroup (and so every process in it) to be gone", func() bool { return d.CgroupGone(victim.ID) })
	})
}
