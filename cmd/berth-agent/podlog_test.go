package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/crilog"
)

// TestRunLogged: the command's stdout and stderr become records of their
// streams, and its exit code (127 for a command not found, 128+n for a
// signal) lands in the exit file.
func TestRunLogged(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want []string // stream + " " + content
		code string
	}{
		{"output", []string{"sh", "-c", "echo out; echo err >&2; printf tail; exit 3"}, []string{"stdout out", "stderr err", "stdout tail"}, "3\n"},
		{"not found", []string{"no-such-command-berth"}, []string{"stderr no-such-command-berth: exec: \"no-such-command-berth\": executable file not found in $PATH"}, "127\n"},
		{"signal", []string{"sh", "-c", "kill -TERM $$"}, nil, "143\n"},
		// A grandchild keeps stdout open (blocked on a FIFO the test
		// opens at the end): the container still ends.
		{"background writer", []string{"sh", "-c", `echo fg; (cat "$0" >/dev/null; echo late) & exit 0`, "FIFO"}, []string{"stdout fg"}, "0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logPath, exitPath := filepath.Join(dir, "pod", "c.log"), filepath.Join(dir, "pod", "c.exit")
			if tc.argv[len(tc.argv)-1] == "FIFO" {
				fifo := filepath.Join(dir, "fifo")
				if err := unix.Mkfifo(fifo, 0o600); err != nil {
					t.Fatal(err)
				}
				tc.argv[len(tc.argv)-1] = fifo
				t.Cleanup(func() {
					// Opening it for writing lets the grandchild's cat end.
					if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
				})
			}
			if _, err := runLogged(logPath, exitPath, tc.argv); err != nil {
				t.Fatalf("runLogged: %v", err)
			}
			if b, err := os.ReadFile(exitPath); err != nil || string(b) != tc.code {
				t.Errorf("exit file = %q, %v; want %q", b, err, tc.code)
			}
			b, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				r, err := crilog.Parse(sc.Bytes())
				if err != nil || r.Partial {
					t.Fatalf("log line %q: %+v, %v", sc.Text(), r, err)
				}
				got = append(got, r.Stream+" "+string(r.Content))
			}
			if !sameByStream(got, tc.want) {
				t.Errorf("records = %q, want %q", got, tc.want)
			}
		})
	}
}

// sameByStream: the same records, in the same order within each stream
// (the two streams are read concurrently).
func sameByStream(got, want []string) bool {
	of := func(l []string, stream string) []string {
		var out []string
		for _, s := range l {
			if strings.HasPrefix(s, stream+" ") {
				out = append(out, s)
			}
		}
		return out
	}
	return len(got) == len(want) && slices.Equal(of(got, crilog.Stdout), of(want, crilog.Stdout)) && slices.Equal(of(got, crilog.Stderr), of(want, crilog.Stderr))
}
