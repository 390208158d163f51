package policy

import (
	"errors"
	"strings"
)

// A path rule is only as good as the agreement between the proxy and the
// server on what a path means. Servers differ: some resolve "..", some
// decode "%2e%2e" or "%2f" first, some merge "//", some treat "\" as "/"
// or cut at ";". So the proxy decides on one canonical form and forwards
// exactly that form, and refuses whatever could still be read two ways.

// maxPathLen bounds a request path the proxy will decide on.
const maxPathLen = 8192

// ErrAmbiguousPath is a request path the proxy refuses to decide on
// because servers may read it differently (encoded "/" or ".", "\", NUL,
// a dot segment with parameters, a malformed escape).
var ErrAmbiguousPath = errors.New("ambiguous request path")

// NormalizePath returns the canonical form of an HTTP request path (no
// query): percent-escapes of unreserved characters decoded, other escapes
// upper-cased, runs of "/" merged, and dot segments removed (RFC 3986
// 5.2.4). It refuses, with an error wrapping ErrAmbiguousPath, paths that
// servers may resolve differently: encoded "/", "." or "\", any "\" or NUL
// or control byte, "." or ".." segments carrying ";" parameters, and
// malformed escapes. The result always starts with "/".
func NormalizePath(raw string) (string, error) {
	if !strings.HasPrefix(raw, "/") {
		return "", pathErr("does not start with /")
	}
	if len(raw) > maxPathLen {
		return "", pathErr("longer than 8192 bytes")
	}
	var b strings.Builder
	b.Grow(len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return "", pathErr("malformed percent-escape")
			}
			d := unhex(raw[i+1])<<4 | unhex(raw[i+2])
			switch {
			case d == '/' || d == '.' || d == '\\' || d == '%' || d < 0x20 || d == 0x7f:
				return "", pathErr("encoded " + describe(d))
			case isUnreserved(d):
				b.WriteByte(d)
			default:
				b.WriteByte('%')
				b.WriteByte(upperHex(raw[i+1]))
				b.WriteByte(upperHex(raw[i+2]))
			}
			i += 2
		case c == '\\':
			return "", pathErr("backslash")
		case c <= ' ' || c == 0x7f || c == '#' || c == '?':
			return "", pathErr(describe(c))
		default:
			b.WriteByte(c)
		}
	}
	segs := strings.Split(b.String()[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		name, _, params := strings.Cut(s, ";")
		if params && (name == "." || name == "..") {
			return "", pathErr("dot segment with parameters")
		}
		switch s {
		case "":
			if last { // keep a trailing slash; merge the rest
				out = append(out, "")
			}
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/"), nil
}

func pathErr(why string) error { return &pathError{why: why} }

type pathError struct{ why string }

func (e *pathError) Error() string { return "ambiguous request path: " + e.why }
func (e *pathError) Unwrap() error { return ErrAmbiguousPath }

func describe(c byte) string {
	switch c {
	case '/':
		return "slash"
	case '.':
		return "dot"
	case '\\':
		return "backslash"
	case '%':
		return "percent sign"
	case 0:
		return "NUL"
	case ' ':
		return "space"
	case '#':
		return "fragment"
	case '?':
		return "question mark"
	}
	return "control character"
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if c >= 'a' && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

// isUnreserved is RFC 3986's unreserved set less ".", which the caller
// refuses when encoded.
func isUnreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '~'
}
