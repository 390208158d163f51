package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/crilog"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// rec is a record line at t0 plus sec seconds; tag "P" makes it partial.
func rec(sec int, stream, tag, content string) string {
	r := crilog.Record{Time: t0.Add(time.Duration(sec) * time.Second), Stream: stream, Partial: tag == "P", Content: []byte(content)}
	return string(r.Append(nil))
}

// sampleLog: stdout and stderr lines a second apart, one line in two
// pieces, and one line written before records were (no time).
var sampleLog = rec(0, "stdout", "F", "one") +
	rec(1, "stderr", "F", "two") +
	rec(2, "stdout", "P", "thr") +
	rec(3, "stdout", "F", "ee") +
	rec(4, "stdout", "F", "") +
	rec(5, "stdout", "F", "five")

func TestLogOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  string
		opts api.ContainerLogOpts
		want string
	}{
		{"all", sampleLog, api.ContainerLogOpts{}, "one\ntwo\nthree\n\nfive\n"},
		{"empty log", "", api.ContainerLogOpts{}, ""},
		{"tail 2", sampleLog, api.ContainerLogOpts{Tail: 2}, "\nfive\n"},
		{"tail counts a line in pieces once", sampleLog, api.ContainerLogOpts{Tail: 3}, "three\n\nfive\n"},
		{"tail past the start", sampleLog, api.ContainerLogOpts{Tail: 100}, "one\ntwo\nthree\n\nfive\n"},
		{"since", sampleLog, api.ContainerLogOpts{SinceTime: t0.Add(1 * time.Second)}, "two\nthree\n\nfive\n"},
		{"since after everything", sampleLog, api.ContainerLogOpts{SinceTime: t0.Add(time.Hour)}, ""},
		{"timestamps", rec(0, "stdout", "F", "one") + rec(1, "stderr", "F", "two"), api.ContainerLogOpts{Timestamps: true},
			"2025-06-01T12:00:00Z one\n2025-06-01T12:00:01Z two\n"},
		{"timestamps once per line", rec(2, "stdout", "P", "thr") + rec(3, "stdout", "F", "ee"), api.ContainerLogOpts{Timestamps: true},
			"2025-06-01T12:00:02Z three\n"},
		{"limit", sampleLog, api.ContainerLogOpts{LimitBytes: 6}, "one\ntw"},
		{"limit past the end", sampleLog, api.ContainerLogOpts{LimitBytes: 1000}, "one\ntwo\nthree\n\nfive\n"},
		{"limit counts timestamps", sampleLog, api.ContainerLogOpts{LimitBytes: 22, Timestamps: true}, "2025-06-01T12:00:00Z o"},
		{"tail, since and limit", sampleLog, api.ContainerLogOpts{Tail: 4, SinceTime: t0.Add(3 * time.Second), LimitBytes: 3}, "ee\n"},
		{"tail with timestamps", sampleLog, api.ContainerLogOpts{Tail: 1, Timestamps: true}, "2025-06-01T12:00:05Z five\n"},
		{"lines without a record", "plain\nold log\n" + rec(9, "stdout", "F", "new"), api.ContainerLogOpts{SinceTime: t0.Add(time.Minute), Timestamps: true}, "plain\nold log\n"},
		{"last line without a newline", "plain\nunfinished", api.ContainerLogOpts{}, "plain\nunfinished\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLogs()
			if tc.log != "" {
				f.files[logPath("main")] = []byte(tc.log)
			}
			got, err := readAll(t, f, tc.opts)
			if err != nil || got != tc.want {
				t.Errorf("logs with %+v = %q, %v; want %q", tc.opts, got, err, tc.want)
			}
		})
	}
}

// TestLogTailWindows: the last lines of a log longer than the first window
// are found by looking further back.
func TestLogTailWindows(t *testing.T) {
	var b strings.Builder
	long := strings.Repeat("x", 1000)
	for i := range 300 {
		b.WriteString(rec(i, "stdout", "F", long))
	}
	b.WriteString(rec(300, "stdout", "F", "last"))
	f := newFakeLogs()
	f.files[logPath("main")] = []byte(b.String())
	got, err := readAll(t, f, api.ContainerLogOpts{Tail: 200})
	if err != nil || strings.Count(got, "\n") != 200 || !strings.HasSuffix(got, long+"\nlast\n") {
		t.Errorf("tail 200 of 301 long lines = %d lines, %v", strings.Count(got, "\n"), err)
	}
}

func TestLastLines(t *testing.T) {
	log := rec(0, "stdout", "F", "a") + rec(1, "stdout", "P", "b") + rec(2, "stdout", "F", "c") + rec(3, "stdout", "F", "d")
	second := int64(len(rec(0, "stdout", "F", "a")))
	last := int64(len(log) - len(rec(3, "stdout", "F", "d")))
	for _, tc := range []struct {
		name    string
		b       string
		atStart bool
		n       int
		off     int64
		ok      bool
	}{
		{"last line", log, true, 1, last, true},
		{"a line in pieces", log, true, 2, second, true},
		{"all", log, true, 3, 0, true},
		{"more than there are", log, true, 9, 0, true},
		{"cut first record skipped", log[5:], false, 1, last - 5, true},
		// Whether the first whole record starts a line is not known
		// (the cut one may have been a P record).
		{"too few known whole", log[5:], false, 2, second - 5, false},
		{"no whole record", "partial", false, 1, 7, false},
		{"record being written", log + "2025-06-01T12:00:0", true, 1, int64(len(log)), true},
	} {
		off, ok := lastLines([]byte(tc.b), tc.atStart, tc.n)
		if off != tc.off || ok != tc.ok {
			t.Errorf("%s: lastLines(…, %v, %d) = %d, %v; want %d, %v", tc.name, tc.atStart, tc.n, off, ok, tc.off, tc.ok)
		}
	}
}

// TestLogFollow: a follower gets the log so far, then each line as it is
// written (on the directory's change events), then EOF once the exit
// code is written.
func TestLogFollow(t *testing.T) {
	f := newFakeLogs()
	f.files[logPath("main")] = []byte(rec(0, "stdout", "F", "before"))
	p, pod := newLogPods(t, f)
	rc, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Follow: true, Timestamps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	br := bufio.NewReader(rc)
	expectLine(t, br, "2025-06-01T12:00:00Z before\n")
	<-f.watching
	f.write(logPath("main"), rec(1, "stderr", "F", "during"))
	expectLine(t, br, "2025-06-01T12:00:01Z during\n")
	// A write and the exit together: the last line is read before EOF.
	f.write(logPath("main"), rec(2, "stdout", "F", "last"))
	f.write(exitPath("main"), "0\n")
	expectLine(t, br, "2025-06-01T12:00:02Z last\n")
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the exit: %q, %v; want EOF", rest, err)
	}
}

// TestLogFollowEnds: a follower ends when its client goes away, when the
// sandbox does (the watch ends), and at once for a container that had
// already exited.
func TestLogFollowEnds(t *testing.T) {
	t.Run("client gone", func(t *testing.T) {
		f := newFakeLogs()
		p, pod := newLogPods(t, f)
		ctx, cancel := context.WithCancel(t.Context())
		rc, err := p.GetContainerLogs(ctx, pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		<-f.watching
		cancel()
		if _, err := io.ReadAll(rc); !errors.Is(err, context.Canceled) {
			t.Errorf("read after cancel = %v, want canceled", err)
		}
		rc.Close()
	})
	t.Run("sandbox gone", func(t *testing.T) {
		f := newFakeLogs()
		f.files[logPath("main")] = []byte(rec(0, "stdout", "F", "x"))
		p, pod := newLogPods(t, f)
		rc, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		br := bufio.NewReader(rc)
		expectLine(t, br, "x\n")
		f.gone()
		if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
			t.Errorf("logs after the sandbox went = %q, %v; want EOF", b, err)
		}
	})
	t.Run("exited", func(t *testing.T) {
		f := newFakeLogs()
		f.files[logPath("main")] = []byte(rec(0, "stdout", "F", "x"))
		f.files[exitPath("main")] = []byte("0\n")
		p, pod := newLogPods(t, f)
		rc, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if b, err := io.ReadAll(rc); err != nil || string(b) != "x\n" {
			t.Errorf("logs = %q, %v; want x then EOF", b, err)
		}
	})
	t.Run("limit", func(t *testing.T) {
		f := newFakeLogs()
		p, pod := newLogPods(t, f)
		rc, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Follow: true, LimitBytes: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		<-f.watching
		f.write(logPath("main"), rec(0, "stdout", "F", "abcdef"))
		if b, err := io.ReadAll(rc); err != nil || string(b) != "abcd" {
			t.Errorf("logs = %q, %v; want abcd then EOF", b, err)
		}
	})
}

// TestLogErrors: --previous has no log to give for a container never
// restarted; a container not started yet has none either.
func TestLogErrors(t *testing.T) {
	f := newFakeLogs()
	p, pod := newLogPods(t, f)
	_, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{Previous: true})
	if !vkerrdefs.IsInvalidInput(err) || !strings.Contains(err.Error(), `previous terminated container "main" in pod "p" not found`) {
		t.Errorf("previous = %v", err)
	}
	_, err = p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "other", api.ContainerLogOpts{})
	if !vkerrdefs.IsNotFound(err) {
		t.Errorf("unknown container = %v, want not found", err)
	}
	p.mu.Lock()
	delete(p.pods[key(pod.Namespace, pod.Name)].containers, "main")
	p.mu.Unlock()
	_, err = p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", api.ContainerLogOpts{})
	if !vkerrdefs.IsInvalidInput(err) || !strings.Contains(err.Error(), "waiting to start") {
		t.Errorf("not started = %v", err)
	}
}

// TestLogPrevious: --previous of a restarted container is its previous
// run's log, whole (not followed), with the options applied; the current
// log is the current run's.
func TestLogPrevious(t *testing.T) {
	f := newFakeLogs()
	p, pod := newLogPods(t, f)
	p.mu.Lock()
	p.pods[key(pod.Namespace, pod.Name)].containers["main"].restarts = 1
	p.mu.Unlock()
	f.files[logPath("main")+crilog.Previous] = []byte(rec(0, "stdout", "F", "run one") + rec(1, "stderr", "F", "failed"))
	f.files[exitPath("main")+crilog.Previous] = []byte("1\n")
	f.files[logPath("main")] = []byte(rec(5, "stdout", "F", "run two"))
	for _, tc := range []struct {
		opts api.ContainerLogOpts
		want string
	}{
		{api.ContainerLogOpts{Previous: true}, "run one\nfailed\n"},
		{api.ContainerLogOpts{Previous: true, Follow: true}, "run one\nfailed\n"},
		{api.ContainerLogOpts{Previous: true, Tail: 1, Timestamps: true}, "2025-06-01T12:00:01Z failed\n"},
		{api.ContainerLogOpts{}, "run two\n"},
	} {
		rc, err := p.GetContainerLogs(t.Context(), pod.Namespace, pod.Name, "main", tc.opts)
		if err != nil {
			t.Fatalf("logs %+v: %v", tc.opts, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != tc.want {
			t.Errorf("logs %+v = %q, %v; want %q", tc.opts, b, err, tc.want)
		}
	}
}

func expectLine(t *testing.T, br *bufio.Reader, want string) {
	t.Helper()
	got, err := br.ReadString('\n')
	if err != nil || got != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// readAll reads the log without following.
func readAll(t *testing.T, f *fakeLogs, opts api.ContainerLogOpts) (string, error) {
	t.Helper()
	var out bytes.Buffer
	s := &logStream{files: f, id: "sb", log: logPath("main"), exit: exitPath("main")}
	err := s.run(t.Context(), newLogFilter(opts, t0), opts.Tail, &out)
	return out.String(), err
}

// newLogPods is a node with one running pod "p" whose sandbox's files are f.
func newLogPods(t *testing.T, f *fakeLogs) (*Pods, *corev1.Pod) {
	t.Helper()
	ps := &podState{pod: testPod(), sandboxID: "sb", containers: map[string]*containerState{"main": {running: true}}}
	ps.pod.Name, ps.pod.Namespace = "p", "default"
	ps.plan.containers = []containerPlan{{name: "main", argv: []string{"true"}}}
	p := &Pods{ctx: t.Context(), sb: fakeSandboxes{logs: f}, log: slog.New(slog.DiscardHandler),
		pods: map[string]*podState{key("default", "p"): ps}}
	return p, ps.pod
}

// fakeSandboxes is a sandbox backend whose files are a fakeLogs; other
// calls are not made by the log code.
type fakeSandboxes struct {
	Sandboxes
	logs *fakeLogs
}

func (s fakeSandboxes) Stat(ctx context.Context, id, path string) (client.EntryInfo, error) {
	return s.logs.Stat(ctx, id, path)
}

func (s fakeSandboxes) ReadFileRange(ctx context.Context, id, path string, off, n int64, w io.Writer) error {
	return s.logs.ReadFileRange(ctx, id, path, off, n, w)
}

func (s fakeSandboxes) WatchDir(ctx context.Context, id, path string, ready func(), fn func(client.FileEvent) error) error {
	return s.logs.WatchDir(ctx, id, path, ready, fn)
}

// fakeLogs is a sandbox's files in memory, with the change events a
// directory watch would report.
type fakeLogs struct {
	mu       sync.Mutex
	files    map[string][]byte
	events   chan client.FileEvent
	ended    chan struct{}
	watching chan struct{} // closed once a watch is in place
	once     sync.Once
}

func newFakeLogs() *fakeLogs {
	return &fakeLogs{files: map[string][]byte{}, events: make(chan client.FileEvent, 16), ended: make(chan struct{}), watching: make(chan struct{})}
}

// write appends to a file and reports the change.
func (f *fakeLogs) write(path, data string) {
	f.mu.Lock()
	f.files[path] = append(f.files[path], data...)
	f.mu.Unlock()
	f.events <- client.FileEvent{Name: path[strings.LastIndexByte(path, '/')+1:], Op: "write"}
}

// gone ends the sandbox: its watches end and its files cannot be read.
func (f *fakeLogs) gone() {
	f.mu.Lock()
	f.files = nil
	f.mu.Unlock()
	close(f.ended)
}

func (f *fakeLogs) Stat(_ context.Context, _, path string) (client.EntryInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.files == nil {
		return client.EntryInfo{}, errdefs.ErrUnavailable
	}
	b, ok := f.files[path]
	if !ok {
		return client.EntryInfo{}, errdefs.ErrNotFound
	}
	return client.EntryInfo{Path: path, Size: int64(len(b))}, nil
}

func (f *fakeLogs) ReadFileRange(ctx context.Context, _, path string, off, n int64, w io.Writer) error {
	f.mu.Lock()
	if f.files == nil {
		f.mu.Unlock()
		return errdefs.ErrUnavailable
	}
	b, ok := f.files[path]
	f.mu.Unlock()
	if !ok {
		return errdefs.ErrNotFound
	}
	if off >= int64(len(b)) {
		return nil
	}
	b = b[off:]
	if n > 0 && int64(len(b)) > n {
		b = b[:n]
	}
	_, err := w.Write(b)
	return err
}

func (f *fakeLogs) WatchDir(ctx context.Context, _, path string, ready func(), fn func(client.FileEvent) error) error {
	if path != podDir {
		return errdefs.ErrNotFound
	}
	ready()
	f.once.Do(func() { close(f.watching) })
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.ended:
			return nil
		case ev := <-f.events:
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
}

// attachIO is kubectl attach's streams without stdin or a terminal.
type attachIO struct{ out, err *nopCloser }

type nopCloser struct{ bytes.Buffer }

func (*nopCloser) Close() error { return nil }

func (a attachIO) Stdin() io.Reader            { return nil }
func (a attachIO) Stdout() io.WriteCloser      { return a.out }
func (a attachIO) Stderr() io.WriteCloser      { return a.err }
func (a attachIO) TTY() bool                   { return false }
func (a attachIO) Resize() <-chan api.TermSize { return nil }

// TestAttach: kubectl attach gets what the container prints from the
// attach on, stdout and stderr apart, and ends when the container exits;
// with stdin it is refused.
func TestAttach(t *testing.T) {
	f := newFakeLogs()
	f.files[logPath("main")] = []byte(rec(0, "stdout", "F", "before the attach"))
	p, pod := newLogPods(t, f)
	a := attachIO{out: &nopCloser{}, err: &nopCloser{}}
	done := make(chan error, 1)
	go func() { done <- p.AttachToContainer(t.Context(), pod.Namespace, pod.Name, "main", a) }()
	<-f.watching
	f.write(logPath("main"), rec(1, "stdout", "F", "out after"))
	f.write(logPath("main"), rec(2, "stderr", "F", "err after"))
	f.write(exitPath("main"), "0\n")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a.out.String() != "out after\n" || a.err.String() != "err after\n" {
		t.Errorf("attached stdout %q, stderr %q; want only what came after, apart", a.out.String(), a.err.String())
	}
	withStdin := attachStdin{a}
	if err := p.AttachToContainer(t.Context(), pod.Namespace, pod.Name, "main", withStdin); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("attach -i = %v, want failed_precondition", err)
	}
}

type attachStdin struct{ attachIO }

func (attachStdin) Stdin() io.Reader { return strings.NewReader("x") }
