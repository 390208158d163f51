package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path"
	"sync"
	"time"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/crilog"
)

const (
	// logChunk is the most one read of a container's log takes.
	logChunk = 1 << 20
	// maxTailWindow bounds how far back from a log's end the lines of a
	// --tail are looked for.
	maxTailWindow = 16 << 20
)

// GetContainerLogs serves kubectl logs: what the container's process has
// printed (stdout and stderr, interleaved as written), from the CRI log
// its wrapper keeps inside the sandbox. Tail, SinceSeconds/SinceTime,
// Timestamps and LimitBytes are applied as the kubelet applies them;
// Follow streams new output as the container writes it, until it ends or
// the client goes away. Previous serves the log of the container's run
// before the current one, kept when it was restarted; a container never
// restarted has none, and the answer is the kubelet's.
func (p *Pods) GetContainerLogs(ctx context.Context, namespace, podName, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	id, restarts, err := p.logTarget(namespace, podName, container)
	if err != nil {
		return nil, err
	}
	f := newLogFilter(opts, time.Now())
	s := &logStream{files: p.sb, id: id, log: logPath(container), exit: exitPath(container), follow: opts.Follow}
	if opts.Previous {
		if restarts == 0 {
			return nil, vkerrdefs.InvalidInputf("previous terminated container %q in pod %q not found", container, podName)
		}
		// That run is over: its log is whole.
		s.log, s.exit, s.follow = logPath(container)+crilog.Previous, exitPath(container)+crilog.Previous, false
	}
	// The stream ends with the request or with the node.
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(p.ctx, cancel)
	pr, pw := io.Pipe()
	rc := &logReader{PipeReader: pr, cancel: cancel}
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		defer stop()
		err := s.run(ctx, f, opts.Tail, pw)
		if err != nil && ctx.Err() == nil {
			p.log.Debug("container_log_failed", "pod", key(namespace, podName), "container", container, "err", err)
		}
		pw.CloseWithError(err)
	}()
	return rc, nil
}

// logTarget is the sandbox of a container whose log can be read, one that
// has started, and how many times it was restarted.
func (p *Pods) logTarget(namespace, name, container string) (string, int, error) {
	id, err := p.sandboxOf(namespace, name, container)
	p.mu.Lock()
	defer p.mu.Unlock()
	var cs *containerState
	var reason string
	if ps, ok := p.pods[key(namespace, name)]; ok {
		cs, reason = ps.containers[container], ps.reason
	}
	switch {
	case (err == nil || vkerrdefs.IsInvalidInput(err)) && cs == nil && reason != "":
		return "", 0, vkerrdefs.InvalidInputf("container %q in pod %q did not start: %s", container, name, reason)
	case (err == nil || vkerrdefs.IsInvalidInput(err)) && cs == nil:
		// As the kubelet answers for a container not yet started.
		return "", 0, vkerrdefs.InvalidInputf("container %q in pod %q is waiting to start: %s", container, name, reasonCreating)
	case err != nil:
		return "", 0, err
	}
	return id, cs.restarts, nil
}

// logReader is the log stream's reading end; Close stops the stream and
// waits for it.
type logReader struct {
	*io.PipeReader
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (r *logReader) Close() error {
	r.cancel()
	err := r.PipeReader.Close()
	r.wg.Wait()
	return err
}

// logStream reads one container's log file out of its sandbox; exit is
// the file whose appearance says the log is whole.
type logStream struct {
	files     logFiles
	id        string
	log, exit string
	follow    bool
	// start is where reading starts when no tail is asked (attach:
	// the log's end when it began).
	start int64
}

// run writes the log through f to w: from the start, or from the last
// tail lines when tail > 0; then, when following, what is added, until
// the container's exit code is written (the log is whole then), the
// sandbox goes away, ctx ends or f has written its limit.
func (s *logStream) run(ctx context.Context, f *logFilter, tail int, w io.Writer) error {
	var lw *logWatch
	if s.follow {
		var err error
		if lw, err = s.watch(ctx); err != nil {
			return err
		}
		defer lw.stop()
	}
	off := s.start
	if tail > 0 {
		var err error
		if off, err = s.tailOffset(ctx, tail); err != nil {
			return err
		}
	}
	out := &filterWriter{f: f, w: w}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Decided before reading: once the exit code is there, this read
		// gets the rest of the log.
		last := lw == nil || lw.done()
		// Everything written so far, in chunks.
		for {
			cw := &countWriter{w: out}
			err := s.files.ReadFileRange(ctx, s.id, s.log, off, logChunk, cw)
			off += cw.n
			switch {
			case errors.Is(err, errLimit):
				return nil
			case errors.Is(err, errdefs.ErrNotFound) && off == 0:
				// Nothing printed yet.
			case err != nil && ctx.Err() != nil:
				return ctx.Err()
			case err != nil && !s.follow:
				return err
			case err != nil:
				// The sandbox went away under a follower: the log ends.
				last = true
			}
			if err != nil || cw.n < logChunk {
				break
			}
		}
		if last {
			return f.flush(w)
		}
		select {
		case <-lw.changed:
		case <-lw.ended:
		case <-ctx.Done():
		}
	}
}

// logWatch follows a container's log directory for a follower.
type logWatch struct {
	// changed has a value once the log or the exit code changed since
	// it was last taken; ended is closed when the watch ends.
	changed chan struct{}
	ended   chan struct{}
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	exited bool
}

// done says whether the log is whole: the exit code was written, or the
// watch ended (the sandbox went away, or there was no directory to watch).
func (lw *logWatch) done() bool {
	select {
	case <-lw.ended:
		return true
	default:
	}
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.exited
}

func (lw *logWatch) stop() {
	lw.cancel()
	lw.wg.Wait()
}

// watch starts watching the container's log directory and returns once
// the watch is in place (or could not be), so that every change from then
// on is seen.
func (s *logStream) watch(ctx context.Context) (*logWatch, error) {
	logName, exitName := path.Base(s.log), path.Base(s.exit)
	wctx, cancel := context.WithCancel(ctx)
	lw := &logWatch{changed: make(chan struct{}, 1), ended: make(chan struct{}), cancel: cancel}
	ready := make(chan struct{})
	lw.wg.Add(1)
	go func() {
		defer lw.wg.Done()
		defer close(lw.ended)
		_ = s.files.WatchDir(wctx, s.id, podDir, func() { close(ready) }, func(ev client.FileEvent) error {
			switch ev.Name {
			case exitName:
				lw.mu.Lock()
				lw.exited = true
				lw.mu.Unlock()
			case logName:
			default:
				return nil
			}
			select {
			case lw.changed <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	select {
	case <-ready:
	case <-lw.ended:
		// No directory to watch (the sandbox is gone, or its pod
		// predates the directory): what the log has is all there is.
	case <-ctx.Done():
		lw.stop()
		return nil, ctx.Err()
	}
	// After the watch is in place: an exit from here on is an event.
	if _, err := s.files.Stat(ctx, s.id, s.exit); err == nil {
		lw.mu.Lock()
		lw.exited = true
		lw.mu.Unlock()
	}
	return lw, nil
}

// tailOffset is where the last n lines of the log start, looked for in
// growing windows back from its end, up to maxTailWindow.
func (s *logStream) tailOffset(ctx context.Context, n int) (int64, error) {
	st, err := s.files.Stat(ctx, s.id, s.log)
	if errors.Is(err, errdefs.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for window := int64(64 << 10); ; window *= 2 {
		from := max(0, st.Size-window)
		var buf bytes.Buffer
		if err := s.files.ReadFileRange(ctx, s.id, s.log, from, st.Size-from, &buf); err != nil {
			return 0, err
		}
		off, ok := lastLines(buf.Bytes(), from == 0, n)
		if ok || from == 0 || window >= maxTailWindow {
			return from + off, nil
		}
	}
}

// lastLines is the offset in b of the start of its last n lines, counting
// a run of P records and the record ending it as one line. atStart says b
// starts the log; otherwise its first line may be cut, and is skipped.
// ok is false when b holds fewer than n lines that are known whole: the
// offset is then of the first one it holds.
func lastLines(b []byte, atStart bool, n int) (int64, bool) {
	var starts []int64
	first := int64(-1)
	pos := 0
	lineStart := atStart // whether the next record begins a line
	if !atStart {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return int64(len(b)), false
		}
		pos = i + 1
	}
	for pos < len(b) {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			// A record still being written: it starts a line if the
			// one before ended one.
			i = len(b) - pos
		}
		if first < 0 {
			first = int64(pos)
		}
		if lineStart {
			starts = append(starts, int64(pos))
		}
		r, err := crilog.Parse(b[pos : pos+i])
		// A stream's P records run on into its next record; the other
		// stream's records between them are rare enough to count alone.
		lineStart = err != nil || !r.Partial
		pos += i + 1
	}
	switch {
	case len(starts) >= n:
		return starts[len(starts)-n], true
	case atStart:
		return 0, true
	case first >= 0:
		return first, false
	}
	return int64(len(b)), false
}

// logFilter turns log records into what the client asked for: those since
// a time, with or without their timestamps, up to a byte limit.
type logFilter struct {
	// stderr, when set, takes the stderr records; w the others.
	stderr     io.Writer
	since      time.Time
	timestamps bool
	// limit is what may still be written; negative is no limit.
	limit int
	// pending is a record not yet whole.
	pending []byte
	// midLine: the stream's last record written was a P record, so its
	// next one goes on the same line.
	midLine map[string]bool
	out     []byte
}

func newLogFilter(opts api.ContainerLogOpts, now time.Time) *logFilter {
	f := &logFilter{timestamps: opts.Timestamps, limit: -1, midLine: map[string]bool{}}
	switch {
	case opts.SinceSeconds > 0:
		f.since = now.Add(-time.Duration(opts.SinceSeconds) * time.Second)
	case !opts.SinceTime.IsZero():
		f.since = opts.SinceTime
	}
	if opts.LimitBytes > 0 {
		f.limit = opts.LimitBytes
	}
	return f
}

// errLimit stops a read once the byte limit is written.
var errLimit = errors.New("log limit reached")

// write takes more of the log file and writes the whole records in it to
// w; it returns errLimit once the limit is reached.
func (f *logFilter) write(w io.Writer, b []byte) error {
	f.pending = append(f.pending, b...)
	for {
		i := bytes.IndexByte(f.pending, '\n')
		if i < 0 {
			return nil
		}
		err := f.line(w, f.pending[:i])
		f.pending = f.pending[i+1:]
		if err != nil {
			return err
		}
	}
}

// flush writes what is left of a last line without its newline.
func (f *logFilter) flush(w io.Writer) error {
	if len(f.pending) == 0 {
		return nil
	}
	err := f.line(w, f.pending)
	f.pending = nil
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

func (f *logFilter) line(w io.Writer, line []byte) error {
	if f.limit == 0 {
		return errLimit
	}
	out := f.out[:0]
	r, err := crilog.Parse(line)
	switch {
	case err != nil:
		// Not a record (a log written before records were): the line as
		// it is, its time unknown.
		out = append(append(out, line...), '\n')
	case !f.since.IsZero() && r.Time.Before(f.since):
		return nil
	default:
		if f.timestamps && !f.midLine[r.Stream] {
			out = r.Time.UTC().AppendFormat(out, time.RFC3339Nano)
			out = append(out, ' ')
		}
		out = append(out, r.Content...)
		if !r.Partial {
			out = append(out, '\n')
		}
		f.midLine[r.Stream] = r.Partial
	}
	f.out = out
	if f.stderr != nil && err == nil && r.Stream == "stderr" {
		w = f.stderr
	}
	if f.limit > 0 && len(out) >= f.limit {
		out = out[:f.limit]
		f.limit = 0
		if _, err := w.Write(out); err != nil {
			return err
		}
		return errLimit
	}
	if f.limit > 0 {
		f.limit -= len(out)
	}
	_, err = w.Write(out)
	return err
}

// filterWriter passes what it is written through a logFilter.
type filterWriter struct {
	f *logFilter
	w io.Writer
}

func (fw *filterWriter) Write(b []byte) (int, error) {
	if err := fw.f.write(fw.w, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// countWriter counts what it passes on.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
