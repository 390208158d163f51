package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// File metadata, as envd 0.6.2+ keeps it: an upload's X-Metadata-<key>
// headers become user.e2b.<key> extended attributes (keys lowercased), an
// upload replaces the file's whole set, and entries (Stat, ListDir, Move,
// upload answers) carry what is on disk.
const (
	metadataHeaderPrefix = "X-Metadata-"
	metadataXattrPrefix  = "user.e2b."
	// Limits keep one file's metadata inside what ext4 stores in its
	// inode and one block (4 KiB in all) and bound what a listing reads.
	maxMetadataKeys  = 32
	maxMetadataKey   = 128
	maxMetadataValue = 1024
	maxMetadataTotal = 3072
)

var errBadMetadata = errors.New("invalid file metadata")

// metadataFromHeaders returns the X-Metadata-* headers of h (prefix
// stripped, keys lowercased), nil when there are none, or an error naming
// the first entry envd would refuse: keys are HTTP tokens, values printable
// ASCII.
func metadataFromHeaders(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, values := range h {
		// Go canonicalises header names ("X-Metadata-Owner"), so the
		// prefix compares case-insensitively.
		if len(values) == 0 || len(name) <= len(metadataHeaderPrefix) || !strings.EqualFold(name[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		key := strings.ToLower(name[len(metadataHeaderPrefix):])
		val := values[0]
		if len(key) > maxMetadataKey {
			return nil, fmt.Errorf("metadata key %q is longer than %d bytes: %w", key, maxMetadataKey, errBadMetadata)
		}
		for _, c := range []byte(key) {
			if !isTokenChar(c) {
				return nil, fmt.Errorf("metadata key %q: only letters, digits and !#$%%&'*+-.^_`|~ are allowed: %w", key, errBadMetadata)
			}
		}
		if len(val) > maxMetadataValue {
			return nil, fmt.Errorf("metadata value of %q is longer than %d bytes: %w", key, maxMetadataValue, errBadMetadata)
		}
		for _, c := range []byte(val) {
			if c < 0x20 || c > 0x7e {
				return nil, fmt.Errorf("metadata value of %q: only printable ASCII is allowed: %w", key, errBadMetadata)
			}
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = val
		total += len(key) + len(val)
	}
	if len(md) > maxMetadataKeys || total > maxMetadataTotal {
		return nil, fmt.Errorf("%d metadata entries of %d bytes: at most %d entries and %d bytes per file: %w", len(md), total, maxMetadataKeys, maxMetadataTotal, errBadMetadata)
	}
	return md, nil
}

// isTokenChar reports whether c may appear in an HTTP token (RFC 9110).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// setMetadata makes md the whole user.e2b.* set of the open file f: keys
// absent from md are removed (O_TRUNC keeps a previous upload's xattrs).
// It works on the descriptor, so it touches exactly the file written, and
// a filesystem without user xattrs (tmpfs without them, /proc) is not an
// error when md is empty.
func setMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	names, err := xattrNames(func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) })
	if err != nil {
		if xattrUnsupported(err) && len(md) == 0 {
			return nil
		}
		return err
	}
	for _, n := range names {
		key, ok := strings.CutPrefix(n, metadataXattrPrefix)
		if _, keep := md[key]; ok && !keep {
			if err := unix.Fremovexattr(fd, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// readMetadata returns path's user.e2b.* attributes (prefix stripped), nil
// when it has none or its filesystem keeps none. It does not follow a final
// symlink (Linux keeps no user attributes on links).
func readMetadata(path string) map[string]string {
	return collectMetadata(
		func(buf []byte) (int, error) { return unix.Llistxattr(path, buf) },
		func(name string, buf []byte) (int, error) { return unix.Lgetxattr(path, name, buf) })
}

// fileMetadata is readMetadata of an open file.
func fileMetadata(f *os.File) map[string]string {
	fd := int(f.Fd())
	return collectMetadata(
		func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		func(name string, buf []byte) (int, error) { return unix.Fgetxattr(fd, name, buf) })
}

func collectMetadata(list func([]byte) (int, error), get func(string, []byte) (int, error)) map[string]string {
	names, err := xattrNames(list)
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, n := range names {
		key, ok := strings.CutPrefix(n, metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		buf := make([]byte, maxMetadataValue)
		size, err := get(n, buf)
		if err != nil {
			// Gone meanwhile, or set out of band larger than an upload
			// may: left out rather than failing the whole entry.
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(buf[:size])
	}
	return md
}

// xattrNames lists attribute names with list (llistxattr or flistxattr),
// growing the buffer if the list grew between the size query and the read.
func xattrNames(list func([]byte) (int, error)) ([]string, error) {
	for range 3 {
		size, err := list(nil)
		if err != nil || size == 0 {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := list(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
	return nil, unix.ERANGE
}

func xattrUnsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}
