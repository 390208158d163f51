package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/crilog"
	"github.com/berth-sandbox/berth/test/harness"
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
			if _, err := (podRun{log: logPath, exit: exitPath}).runLogged(tc.argv); err != nil {
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

// TestRunLoggedRestart: a rotation before a restart keeps the last run's
// log, exit code and run record beside them, and the restart starts new
// ones; a first run keeps nothing.
func TestRunLoggedRestart(t *testing.T) {
	dir := t.TempDir()
	r := podRun{log: filepath.Join(dir, "c.log"), exit: filepath.Join(dir, "c.exit"), run: filepath.Join(dir, "c.run")}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	content := func(p string) []string {
		t.Helper()
		var out []string
		sc := bufio.NewScanner(strings.NewReader(read(p)))
		for sc.Scan() {
			rec, err := crilog.Parse(sc.Bytes())
			if err != nil {
				t.Fatalf("%s: line %q: %v", p, sc.Text(), err)
			}
			out = append(out, string(rec.Content))
		}
		return out
	}
	run := func(p string) crilog.Run {
		t.Helper()
		rec, err := crilog.ParseRun([]byte(read(p)))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return rec
	}

	if _, err := r.runLogged([]string{"sh", "-c", "echo first; exit 1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.log + crilog.Previous); !os.IsNotExist(err) {
		t.Errorf("first run left a previous log: %v", err)
	}
	if got := run(r.run); got.Restart != 0 {
		t.Errorf("first run record = %+v, want restart 0", got)
	}
	for i, out := range []string{"second", "third"} {
		r.restart = i + 1
		if err := r.rotate(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(r.exit); !os.IsNotExist(err) {
			t.Errorf("rotated: the exit file is still there: %v", err)
		}
		if _, err := r.runLogged([]string{"sh", "-c", "echo " + out}); err != nil {
			t.Fatal(err)
		}
		if got := content(r.log); !slices.Equal(got, []string{out}) {
			t.Errorf("restart %d: log = %q, want %q", r.restart, got, out)
		}
		if got := read(r.exit); got != "0\n" {
			t.Errorf("restart %d: exit = %q", r.restart, got)
		}
		if got := run(r.run); got.Restart != r.restart {
			t.Errorf("restart %d: run record = %+v", r.restart, got)
		}
		if got := run(r.run + crilog.Previous); got.Restart != i {
			t.Errorf("restart %d: previous run record = %+v, want restart %d", r.restart, got, i)
		}
	}
	if got := content(r.log + crilog.Previous); !slices.Equal(got, []string{"second"}) {
		t.Errorf("previous log = %q, want only the run before (second)", got)
	}
	if got := read(r.exit + crilog.Previous); got != "0\n" {
		t.Errorf("previous exit = %q", got)
	}
}

// TestRunLoggedInput: a container's stdin is what writers put into its
// FIFO, writer after writer (or, once, the first writer's only, after
// which a writer finds no reader); on a terminal its output is one
// stream, logged as stdout, its input echoed.
func TestRunLoggedInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     podInput
		argv   []string
		writes []string
		want   string // in the stdout records
		code   string
	}{
		{"once", podInput{once: true}, []string{"cat"}, []string{"hello\n"}, "hello", "0\n"},
		{"writers in turn", podInput{}, []string{"sh", "-c", `read a; read b; echo "$a-$b"`}, []string{"x\n", "y\n"}, "x-y", "0\n"},
		{"terminal", podInput{tty: true}, []string{"sh", "-c", `read a; test -t 0 && echo "got-$a on a tty"; exit 4`}, []string{"abc\n"}, "got-abc on a tty", "4\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := podRun{log: filepath.Join(dir, "c.log"), exit: filepath.Join(dir, "c.exit"), in: tc.in}
			r.in.stdin = filepath.Join(dir, "c.stdin")
			if tc.in.tty {
				r.in.resize = filepath.Join(dir, "c.resize")
			}
			done := make(chan error, 1)
			go func() {
				_, err := r.runLogged(tc.argv)
				done <- err
			}()
			write := func(fifo, s string) {
				t.Helper()
				// The wrapper makes the FIFO as it starts the command.
				harness.WaitFor(t, 30*time.Second, fifo+" made", func() bool {
					fi, err := os.Stat(fifo)
					return err == nil && fi.Mode()&os.ModeNamedPipe != 0
				})
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if fifo == r.in.resize {
					_, err = f.WriteString(s)
				} else {
					err = writeFrames(f, strings.NewReader(s))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if tc.in.tty {
				write(r.in.resize, "100 30\n")
			}
			for _, s := range tc.writes {
				write(r.in.stdin, s)
			}
			if err := <-done; err != nil {
				t.Fatalf("runLogged: %v", err)
			}
			if b, err := os.ReadFile(r.exit); err != nil || string(b) != tc.code {
				t.Errorf("exit file = %q, %v; want %q", b, err, tc.code)
			}
			b, err := os.ReadFile(r.log)
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				rec, err := crilog.Parse(sc.Bytes())
				if err != nil || rec.Stream != crilog.Stdout && tc.in.tty {
					t.Fatalf("log line %q: %+v, %v", sc.Text(), rec, err)
				}
				out.Write(rec.Content)
				if !rec.Partial {
					out.WriteByte('\n')
				}
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output %q, want %q in it", out.String(), tc.want)
			}
		})
	}
}

// TestFeedInput: frames from writers in turn reach the command's input
// whole; once, the first writer's end closes it (and the FIFO).
func TestFeedInput(t *testing.T) {
	for _, once := range []bool{false, true} {
		fr, fw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		ir, iw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			feedInput(fr, iw, once)
		}()
		big := strings.Repeat("x", 3*inputFrameMax+5) // several frames
		for i, s := range []string{"first\n", big, "third\n"} {
			// Once, the FIFO may be closed by the time the second
			// writer writes: its write may fail.
			if err := writeFrames(fw, strings.NewReader(s)); err != nil && (i == 0 || !once) {
				t.Fatal(err)
			}
		}
		if once {
			<-done // ended after the first writer's input
			b, _ := io.ReadAll(ir)
			if string(b) != "first\n" {
				t.Errorf("once: input %q, want the first writer's only", b)
			}
			continue
		}
		b := make([]byte, len("first\n")+len(big)+len("third\n"))
		if _, err := io.ReadFull(ir, b); err != nil || string(b) != "first\n"+big+"third\n" {
			t.Errorf("input %d bytes (%v), want the three writers' in turn", len(b), err)
		}
		fw.Close()
		<-done
	}
}

// gateReader returns data once, then io.EOF once gate is closed.
type gateReader struct {
	data []byte
	gate chan struct{}
}

func (g *gateReader) Read(p []byte) (int, error) {
	if len(g.data) > 0 {
		n := copy(p, g.data)
		g.data = g.data[n:]
		return n, nil
	}
	<-g.gate
	return 0, io.EOF
}

// TestWriteFramesReaderGone: a command that took its input and ended
// before the end frame was written lost nothing: that is no error; a
// reader gone before the input is one.
func TestWriteFramesReaderGone(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	g := &gateReader{data: []byte("abc"), gate: make(chan struct{})}
	go func() {
		buf := make([]byte, 7)
		_, _ = io.ReadFull(pr, buf) // the data frame
		pr.Close()
		close(g.gate)
	}()
	if err := writeFrames(pw, g); err != nil {
		t.Errorf("writeFrames with the reader gone before the end frame = %v, want nil", err)
	}
	pr2, pw2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw2.Close()
	pr2.Close()
	if err := writeFrames(pw2, strings.NewReader("abc")); !errors.Is(err, unix.EPIPE) {
		t.Errorf("writeFrames with no reader at all = %v, want EPIPE", err)
	}
}
