package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// fakeFiles is a sandbox's file system as its agent serves it.
type fakeFiles struct {
	mu       sync.Mutex
	files    map[string]string
	failPath string
}

func (f *fakeFiles) ReadFile(ctx context.Context, addr, token, path string, max int64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[path]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return []byte(b), nil
}

func (f *fakeFiles) WriteFile(ctx context.Context, addr, token, path string, r io.Reader) error {
	if path == f.failPath {
		return errors.New("disk full")
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[path] = string(b)
	return nil
}

// resolvEgress answers ResolvConf; installEgress calls nothing else.
type resolvEgress struct{ Egress }

func (resolvEgress) ResolvConf(hostIP netip.Addr) []byte {
	return []byte("nameserver " + hostIP.String() + "\n")
}

// installEgress writes resolv.conf, the CA alone, in Debian's store and
// appended to the sandbox's own system bundle (or alone without one).
func TestInstallEgress(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
	tests := []struct {
		name       string
		system     string // "" = none
		wantBundle string
	}{
		{"system bundle", "ROOTS\n", "ROOTS\n" + ca},
		{"system bundle without final newline", "ROOTS", "ROOTS\n" + ca},
		{"no system bundle", "", ca},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := &fakeFiles{files: map[string]string{}}
			if tt.system != "" {
				files.files[systemBundlePath] = tt.system
			}
			m := &Manager{deps: Deps{Egress: resolvEgress{}, Files: files}, log: slog.New(slog.DiscardHandler)}
			e := &entry{att: Attachment{HostIP: netip.MustParseAddr("198.18.0.1"), SandboxIP: netip.MustParseAddr("198.18.0.2")}}
			if err := m.installEgress(t.Context(), e, []byte(ca)); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				resolvConfPath:     "nameserver 198.18.0.1\n",
				egressCAPath:       ca,
				egressDebianCAPath: ca,
				egressBundlePath:   tt.wantBundle,
			}
			for path, body := range want {
				if got := files.files[path]; got != body {
					t.Errorf("%s = %q, want %q", path, got, body)
				}
			}
			if tt.system != "" && files.files[systemBundlePath] != tt.system {
				t.Errorf("the system bundle changed: %q", files.files[systemBundlePath])
			}
		})
	}
	files := &fakeFiles{files: map[string]string{}, failPath: egressBundlePath}
	m := &Manager{deps: Deps{Egress: resolvEgress{}, Files: files}, log: slog.New(slog.DiscardHandler)}
	err := m.installEgress(t.Context(), &entry{}, []byte(ca))
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("installEgress with a failing write = %v, want the write's error", err)
	}
}
