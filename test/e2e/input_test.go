package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// TestLimitRanges: limits outside what the host can give are refused,
// through the API and the CLI, with the field and the allowed range named;
// 0 never silently means "the default".
func TestLimitRanges(t *testing.T) {
	d := StartDaemon(t)
	cores := fmt.Sprint(runtime.NumCPU())
	tests := []struct {
		req   client.CreateRequest
		flags []string
		field string
		want  string
	}{
		{client.CreateRequest{CPU: 64}, []string{"--cpu", "64"}, "cpu", "want 0.1 to " + cores},
		{client.CreateRequest{CPU: 0.05}, []string{"--cpu", "0.05"}, "cpu", "want 0.1 to " + cores},
		{client.CreateRequest{Memory: "0"}, []string{"--memory", "0"}, "memory", "at least 16M"},
		{client.CreateRequest{Memory: "1K"}, []string{"--memory", "1K"}, "memory", "memory 1KiB is out of range: want 16MiB to"},
		{client.CreateRequest{Disk: "0"}, []string{"--disk", "0"}, "disk", "at least 64M"},
	}
	for _, tt := range tests {
		tt.req.Template = "minimal"
		_, err := d.Client.Create(t.Context(), tt.req)
		var we *errdefs.Error
		if !errors.As(err, &we) || !errors.Is(err, errdefs.ErrInvalidArgument) || we.Field != tt.field || !strings.Contains(we.Message, tt.want) {
			t.Errorf("Create(%+v) = %v (%+v), want invalid_argument on field %s saying %q", tt.req, err, we, tt.field, tt.want)
		}
		_, stderr, code := d.CLI(t, nil, append([]string{"create", "--template", "minimal"}, tt.flags...)...)
		if code != 1 || !strings.Contains(stderr, tt.want) || !strings.HasSuffix(stderr, "(invalid_argument)\n") {
			t.Errorf("berth create %q = %d, %q; want 1 and an invalid_argument error saying %q", tt.flags, code, stderr, tt.want)
		}
	}
	sbs, err := d.Client.List(t.Context(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 0 {
		t.Errorf("refused creates left sandboxes: %+v", sbs)
	}
}

// TestDataDirUnderPrivateParent: a data dir whose parent others cannot
// search (mktemp -d makes 0700 dirs) is refused at startup with what to
// do, instead of every create failing with runc's bare "permission denied".
func TestDataDirUnderPrivateParent(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Berth, "serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(parent, "data"),
		"--instance", "tpriv", "--agent", bin.Agent)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ctx.Err() != nil {
		t.Fatalf("berth serve under a 0700 parent = %v, want it to exit non-zero at once\n%s", err, out)
	}
	if !strings.Contains(string(out), parent) || !strings.Contains(string(out), "chmod o+x") {
		t.Errorf("berth serve under a 0700 parent said %q; want the parent named and the fix", out)
	}
}
