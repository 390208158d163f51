package secret

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set("NPM_TOKEN", []byte("hunter2")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if err := s.Set("NPM_TOKEN", []byte("hunter3")); err != nil {
		t.Fatalf("Set again: %v", err)
	}
	got, err := s.Get("NPM_TOKEN")
	if err != nil || string(got) != "hunter3" {
		t.Fatalf("Get = %q, %v; want hunter3", got, err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "NPM_TOKEN")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode = %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "NPM_TOKEN" || list[0].SizeBytes != 7 {
		t.Errorf("List = %+v, %v", list, err)
	}
	if !s.Has("NPM_TOKEN") || s.Has("OTHER") {
		t.Errorf("Has is wrong")
	}
	if err := s.Remove("NPM_TOKEN"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := s.Get("NPM_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Remove = %v, want ErrNotFound", err)
	}
	if err := s.Remove("NPM_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove twice = %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"", "../x", "a/b", "9A", "A-B"} {
		if err := s.Set(bad, []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Set(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := s.Set("BIG", make([]byte, MaxSize+1)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Set(oversized) = %v, want ErrInvalidArgument", err)
	}
}
