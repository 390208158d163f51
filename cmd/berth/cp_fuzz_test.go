package main

import (
	"strings"
	"testing"
)

// FuzzParseCpArgs checks "berth cp" argument parsing: a sandbox ID is only
// ever taken from a prefix that looks like one, the path is the rest
// unchanged, and an accepted pair has exactly one side in a sandbox.
func FuzzParseCpArgs(f *testing.F) {
	for _, s := range [][2]string{
		{"abc123:/tmp/x", "./local"}, {"./foo:bar", "abc:/x"}, {"/abs:path", "id:"},
		{"ID:/upper", "x"}, {"a:b:c", "."}, {"", ""}, {":x", "y:"}, {"abc:../../etc", "/tmp"},
		{"abc\x00:x", "y"}, {"é:x", "y"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, src, dst string) {
		for _, s := range []string{src, dst} {
			a := parseCpArg(s)
			switch {
			case a.id == "" && a.path != s:
				t.Fatalf("parseCpArg(%q) = local %q, want the argument unchanged", s, a.path)
			case a.id != "" && (!isSandboxID(a.id) || a.id+":"+a.path != s):
				t.Fatalf("parseCpArg(%q) = %+v: id and path do not recompose the argument", s, a)
			case a.id != "" && (strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".")):
				t.Fatalf("parseCpArg(%q) took an explicit local path as sandbox %q", s, a.id)
			}
		}
		from, to, err := parseCpArgs(src, dst)
		if err != nil {
			return
		}
		if (from.id == "") == (to.id == "") || from.path == "" || to.path == "" {
			t.Fatalf("parseCpArgs(%q, %q) = %+v, %+v: want exactly one sandbox side and two paths", src, dst, from, to)
		}
	})
}
