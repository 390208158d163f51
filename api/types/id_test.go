package types

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestValidSandboxID(t *testing.T) {
	for _, id := range []string{"a", "0", "abcdefghij0123456789", strings.Repeat("z", 64)} {
		if err := ValidSandboxID(id); err != nil {
			t.Errorf("ValidSandboxID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", strings.Repeat("z", 65), "A", "a-b", "a_b", "a.b", "..", "a/b", "é", "a\x00", " a"} {
		if err := ValidSandboxID(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidSandboxID(%q) = %v, want invalid argument", id, err)
		}
	}
}

// FuzzValidSandboxID pins what callers rely on: an accepted ID is a single
// clean path component, a DNS label and an nftables-safe name.
func FuzzValidSandboxID(f *testing.F) {
	for _, s := range []string{"abc", "", "..", "a/b", "A", "a-b", strings.Repeat("a", 65), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidSandboxID(id)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ValidSandboxID(%q) error %v is not invalid argument", id, err)
			}
			return
		}
		if len(id) == 0 || len(id) > MaxSandboxIDLen {
			t.Errorf("accepted %q of length %d", id, len(id))
		}
		if filepath.Base(id) != id || filepath.Clean(id) != id || id == "." || id == ".." {
			t.Errorf("accepted %q, not one clean path component", id)
		}
		if strings.ToLower(id) != id || strings.ContainsAny(id, "-_./\\ \x00") {
			t.Errorf("accepted %q with characters outside [a-z0-9]", id)
		}
	})
}

func TestNewSandboxID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewSandboxID()
		if err := ValidSandboxID(id); err != nil || len(id) != 20 || id[0] < 'a' || id[0] > 'z' {
			t.Fatalf("NewSandboxID() = %q (%v): want 20 of [a-z0-9] starting with a letter", id, err)
		}
		if seen[id] {
			t.Fatalf("NewSandboxID() minted %q twice", id)
		}
		seen[id] = true
	}
}

// TestValidTemplateName: exactly the names [a-z0-9][a-z0-9_-]{0,62}.
func TestValidTemplateName(t *testing.T) {
	rule := regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	for _, name := range []string{"", "a", "base", "my-tpl_2", "-x", "_x", "A", "a.b", "a/b", "..", "x y",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "é"} {
		if got, want := ValidTemplateName(name) == nil, rule.MatchString(name); got != want {
			t.Errorf("ValidTemplateName(%q) valid = %v, want %v", name, got, want)
		}
	}
}
