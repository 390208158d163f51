package workspace

import (
	"errors"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// FuzzParse feeds arbitrary files to the parser: it must never panic, and
// every failure must be an invalid-argument ParseError with a message.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		full, "", "{}", "setup: [a, {run: b}]", "network: {setup: {mode: allow, allow: ['*.x.test', 10.0.0.0/8:443]}}",
		"resources: {cpu: 1e3, memory: 1T}", "env: {A: &x y, B: *x}", "secrets: [[a]]", "setup:\n  - {name: [x], run: 1}\n",
		"network: {agent: {http: [{host: a.test, methods: [GET], path: /, extra: 1}]}}", "\x00", "a: b: c",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Parse(data)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || len(pe.Problems) == 0 || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Parse(%q) = %v, want a ParseError with problems", data, err)
			}
			return
		}
		if env == nil {
			t.Fatalf("Parse(%q) returned nil without an error", data)
		}
		for _, s := range env.Setup {
			if s.Run == "" {
				t.Fatalf("Parse(%q) accepted an empty step", data)
			}
		}
	})
}
