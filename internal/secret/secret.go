// Package secret is the host-side secret store: named values the operator
// sets (`berth secret set NAME`) and workspace setup steps receive as
// environment variables. Values live in one 0600 file per secret under a
// 0700 directory of the data dir; no API ever returns them, only names.
package secret

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

var namePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ValidName reports whether name can name a secret: it becomes an
// environment variable, so [A-Za-z_][A-Za-z0-9_]{0,63}.
func ValidName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("secret name %q: must match [A-Za-z_][A-Za-z0-9_]{0,63}: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// MaxSize bounds one secret value.
const MaxSize = 64 << 10

// Info describes a stored secret without its value.
type Info struct {
	Name      string
	UpdatedAt time.Time
	SizeBytes int64
}

// Store keeps secrets in a directory. It is safe for concurrent use: every
// write is a rename of a complete file.
type Store struct {
	dir string
}

// New returns a Store in dir, creating it 0700.
func New(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(name string) string { return filepath.Join(s.dir, name) }

// Set stores value under name, replacing any previous value.
func (s *Store) Set(name string, value []byte) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if len(value) > MaxSize {
		return fmt.Errorf("secret %s is %d bytes, over the %d-byte limit: %w", name, len(value), MaxSize, errdefs.ErrInvalidArgument)
	}
	f, err := os.CreateTemp(s.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("set secret %s: %w", name, err)
	}
	tmp := f.Name()
	_, err = f.Write(value)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.path(name))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("set secret %s: %w", name, err)
	}
	return nil
}

// Get returns a secret's value. Only the host side (workspace setup) calls
// it; no API hands values out.
func (s *Store) Get(name string) ([]byte, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("secret %s is not set (berth secret set %s): %w", name, name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read secret %s: %w", name, err)
	}
	return b, nil
}

// Has reports whether a secret is set.
func (s *Store) Has(name string) bool {
	if ValidName(name) != nil {
		return false
	}
	fi, err := os.Stat(s.path(name))
	return err == nil && fi.Mode().IsRegular()
}

// List returns every secret's name and metadata, sorted by name.
func (s *Store) List() ([]Info, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.Type().IsRegular() || ValidName(e.Name()) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, Info{Name: e.Name(), UpdatedAt: fi.ModTime().UTC(), SizeBytes: fi.Size()})
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}

// Remove deletes a secret.
func (s *Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	err := os.Remove(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	return err
}
