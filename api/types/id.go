package types

import (
	"crypto/rand"
	"fmt"

	"github.com/berth-sandbox/berth/errdefs"
)

// MaxSandboxIDLen is the longest sandbox ID.
const MaxSandboxIDLen = 64

// ValidSandboxID checks id against the sandbox-ID grammar, 1 to 64
// characters of [a-z0-9] (the daemon mints 20), and returns an
// invalid-argument error naming it otherwise. The grammar is what lets
// every layer use an ID as it is: in API paths, E2B host names
// (<port>-<id>.<domain>), file and directory names, cgroup and runc
// container names, and nftables chain names; so it is the one check all of
// them make.
func ValidSandboxID(id string) error {
	if id == "" || len(id) > MaxSandboxIDLen {
		return fmt.Errorf("sandbox ID %q: want 1-%d characters of [a-z0-9]: %w", id, MaxSandboxIDLen, errdefs.ErrInvalidArgument)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("sandbox ID %q: want only [a-z0-9]: %w", id, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// NewSandboxID mints a sandbox ID: 20 random characters of [a-z0-9],
// starting with a letter so an ID never looks like a number. The daemon
// and the Kubernetes gateway (whose pod names are its IDs) mint them so.
func NewSandboxID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [20]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = alphabet[int(b[0])%26]
	return string(b[:])
}

// ValidUserName reports whether u is a POSIX-portable account name (at
// most 32 characters): what a create's user may name, on a daemon and on
// the Kubernetes gateway alike.
func ValidUserName(u string) bool {
	if u == "" || len(u) > 32 {
		return false
	}
	for i, c := range u {
		ok := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && (c == '-' || c == '.' || (c >= '0' && c <= '9')))
		if !ok {
			return false
		}
	}
	return true
}

// MaxTemplateNameLen is the longest template name.
const MaxTemplateNameLen = 63

// ValidTemplateName checks a template name: 1–63 characters of
// [a-z0-9_-], starting with a letter or digit. A name is a directory name
// on each daemon and a path segment of the API, so the daemon's template
// store and the Kubernetes gateway make this one check.
func ValidTemplateName(name string) error {
	ok := name != "" && len(name) <= MaxTemplateNameLen
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("template name %q: must match [a-z0-9][a-z0-9_-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// MaxBuildContext bounds the bytes of a Dockerfile build's context (a tar
// stream) sent to a daemon or the Kubernetes gateway.
const MaxBuildContext = 1 << 30
