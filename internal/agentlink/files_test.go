package agentlink

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agent"
)

// The host writes and reads sandbox files through a real agent (here on
// the host, so its paths are the test's temporary directory).
func TestReadWriteFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the agent acts as root for these requests")
	}
	srv, err := agent.New(agent.Config{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	addr := strings.TrimPrefix(ts.URL, "http://")
	l := New()
	dir := t.TempDir()
	path := filepath.Join(dir, "etc", "berth", "f.pem")

	if err := l.WriteFile(t.Context(), addr, "tok", path, strings.NewReader("hello\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	got, err := l.ReadFile(t.Context(), addr, "tok", path, 1<<20)
	if err != nil || string(got) != "hello\n" {
		t.Fatalf("ReadFile = %q, %v; want %q", got, err, "hello\n")
	}
	if _, err := l.ReadFile(t.Context(), addr, "tok", path, 3); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("ReadFile past max = %v, want ErrResourceExhausted", err)
	}
	if _, err := l.ReadFile(t.Context(), addr, "tok", filepath.Join(dir, "missing"), 1<<20); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile of a missing file = %v, want ErrNotFound", err)
	}
	if _, err := l.ReadFile(t.Context(), addr, "wrong", path, 1<<20); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile with a wrong token = %v, want a refusal", err)
	}
}
