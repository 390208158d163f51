package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

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

// rootRuntime is a fakeRuntime that also reaches its sandboxes' root
// filesystems from the host (RootWriter), one map of files for all.
type rootRuntime struct {
	*fakeRuntime
	files    *fakeFiles
	failPath string
}

func (r *rootRuntime) ReadRootFile(id, path string, max int64) ([]byte, error) {
	return r.files.ReadFile(context.Background(), "", "", path, max)
}

func (r *rootRuntime) WriteRootFile(id, path string, data []byte) error {
	if path == r.failPath {
		return errors.New("read-only file system")
	}
	return r.files.WriteFile(context.Background(), "", "", path, bytes.NewReader(data))
}

// A create on a runtime that reaches the sandbox's root from the host
// (RootWriter) writes the egress settings there, the system bundle
// extended, and asks the agent for none of them; a failing write fails
// the create and leaves nothing.
func TestCreateInstallsEgressFromHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := &fakeFiles{files: map[string]string{systemBundlePath: "ROOTS\n"}}
		f := newLifeFixture(t, func(d *Deps) {
			d.Runtime = &rootRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), files: root}
		})
		if _, err := f.m.Create(t.Context(), CreateRequest{}); err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]string{egressCAPath: "ca", egressDebianCAPath: "ca", egressBundlePath: "ROOTS\nca"} {
			if got := root.files[path]; got != want {
				t.Errorf("%s in the root = %q, want %q", path, got, want)
			}
		}
		if got := root.files[resolvConfPath]; !strings.HasPrefix(got, "nameserver ") {
			t.Errorf("resolv.conf in the root = %q", got)
		}
		if len(f.fs.files) != 0 {
			t.Errorf("the agent was asked for files: %v", slices.Collect(maps.Keys(f.fs.files)))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f := newLifeFixture(t, func(d *Deps) {
			d.Runtime = &rootRuntime{fakeRuntime: d.Runtime.(*fakeRuntime), files: &fakeFiles{files: map[string]string{}}, failPath: egressBundlePath}
		})
		_, err := f.m.Create(t.Context(), CreateRequest{})
		if err == nil || !strings.Contains(err.Error(), "read-only file system") {
			t.Errorf("Create with a failing root write = %v, want its error", err)
		}
		f.assertNothingLeft(t)
	})
}
