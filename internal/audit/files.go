package audit

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/berth-sandbox/berth/api/types"
)

// Files is a set of append-only JSONL files, one per sandbox, each rotated
// by size: <id>.jsonl, then <id>.jsonl.1 (newest) … <id>.jsonl.<keep>. The
// egress audit log and the work log both keep their records in one.
type Files struct {
	dir      string
	maxBytes int64
	keep     int

	retain Retention

	mu    sync.Mutex
	files map[string]*file
}

// Retention says what survives rotation: when the oldest file would be
// deleted, its first HeadBytes (only for a sandbox's very first file: its
// earliest records) and the lines Keep selects are first appended to
// <id>.jsonl.kept, up to MaxBytes in all. A log that is evidence must not
// be flushed away by the traffic it records.
type Retention struct {
	HeadBytes int64
	MaxBytes  int64
	Keep      func(line []byte) bool
}

type file struct {
	f    *os.File
	w    *bufio.Writer
	size int64
}

// NewFiles opens dir (created 0700); zero maxBytes and keep take 16 MiB
// and 3.
func NewFiles(dir string, maxBytes int64, keep int) (*Files, error) {
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	if keep <= 0 {
		keep = 3
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	return &Files{dir: dir, maxBytes: maxBytes, keep: keep, files: map[string]*file{}}, nil
}

// Retain sets what survives rotation; call it before the first Append.
func (fs *Files) Retain(r Retention) { fs.retain = r }

func (fs *Files) keptPath(id string) string { return fs.Path(id) + ".kept" }

// Path is the current file of id.
func (fs *Files) Path(id string) string { return filepath.Join(fs.dir, id+".jsonl") }

// Paths are every file of id, oldest first, whether or not they exist.
func (fs *Files) Paths(id string) []string {
	out := make([]string, 0, fs.keep+2)
	if fs.retain.MaxBytes > 0 {
		out = append(out, fs.keptPath(id))
	}
	for i := fs.keep; i >= 1; i-- {
		out = append(out, fmt.Sprintf("%s.%d", fs.Path(id), i))
	}
	return append(out, fs.Path(id))
}

// Append writes one line (ending in '\n') to id's file, rotating first if
// it would grow past the limit. Each line is flushed at once: a reader, or
// a crash, sees every record.
func (fs *Files) Append(id string, line []byte) error {
	// Files are named after sandbox IDs: only the grammar's.
	if err := types.ValidSandboxID(id); err != nil {
		return fmt.Errorf("log for %w", err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.write(id, line)
}

func (fs *Files) write(id string, line []byte) error {
	f := fs.files[id]
	if f == nil {
		fd, err := os.OpenFile(fs.Path(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		st, err := fd.Stat()
		if err != nil {
			fd.Close()
			return err
		}
		f = &file{f: fd, w: bufio.NewWriter(fd), size: st.Size()}
		fs.files[id] = f
	}
	if f.size > 0 && f.size+int64(len(line)) > fs.maxBytes {
		if err := fs.rotate(id, f); err != nil {
			return err
		}
		return fs.write(id, line)
	}
	if _, err := f.w.Write(line); err != nil {
		return err
	}
	f.size += int64(len(line))
	return f.w.Flush()
}

func (fs *Files) rotate(id string, f *file) error {
	f.w.Flush()
	f.f.Close()
	delete(fs.files, id)
	base := fs.Path(id)
	oldest := fmt.Sprintf("%s.%d", base, fs.keep)
	if fs.retain.MaxBytes > 0 {
		if err := fs.keepFrom(id, oldest); err != nil {
			return fmt.Errorf("keep records of %s: %w", oldest, err)
		}
	}
	os.Remove(oldest)
	for i := fs.keep - 1; i >= 1; i-- {
		// A gap in the chain (fewer files than keep so far) is no error.
		_ = os.Rename(fmt.Sprintf("%s.%d", base, i), fmt.Sprintf("%s.%d", base, i+1))
	}
	return os.Rename(base, base+".1")
}

// keepFrom appends what the retention keeps of path (about to be
// deleted) to id's kept file. The kept file does not exist before the
// first file rotates away, so its absence marks path as holding the
// sandbox's earliest records.
func (fs *Files) keepFrom(id, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	kp := fs.keptPath(id)
	head := int64(0)
	st, err := os.Stat(kp)
	switch {
	case errors.Is(err, os.ErrNotExist):
		head = fs.retain.HeadBytes
	case err != nil:
		return err
	}
	var size int64
	if st != nil {
		size = st.Size()
	}
	if size >= fs.retain.MaxBytes {
		return nil
	}
	out, err := os.OpenFile(kp, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(out)
	var werr error
	_, err = ReadLines(path, 0, func(line []byte) {
		keep := head > 0
		if keep {
			head -= int64(len(line))
		} else {
			keep = fs.retain.Keep != nil && fs.retain.Keep(line)
		}
		if !keep || werr != nil || size+int64(len(line)) > fs.retain.MaxBytes {
			return
		}
		_, werr = w.Write(line)
		size += int64(len(line))
	})
	if err == nil {
		err = werr
	}
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes id's open file (it stays on disk: it is the record).
func (fs *Files) Close(id string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f := fs.files[id]; f != nil {
		f.w.Flush()
		f.f.Close()
		delete(fs.files, id)
	}
}

// CloseAll closes every open file.
func (fs *Files) CloseAll() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for id, f := range fs.files {
		f.w.Flush()
		f.f.Close()
		delete(fs.files, id)
	}
}

// ReadLines calls fn with each whole line of path from offset off and
// returns the offset after the last whole line; a partial last line (still
// being written) is left for the next read. A missing file has no lines.
func ReadLines(path string, off int64, fn func([]byte)) (int64, error) {
	fd, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return off, nil
	}
	if err != nil {
		return off, err
	}
	defer fd.Close()
	if _, err := fd.Seek(off, 0); err != nil {
		return off, err
	}
	br := bufio.NewReader(fd)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return off, nil
		}
		off += int64(len(line))
		fn(line)
	}
}

// Remove closes and deletes every file of id (a sandbox whose record is
// removed takes its logs with it).
func (fs *Files) Remove(id string) error {
	if err := types.ValidSandboxID(id); err != nil {
		return fmt.Errorf("log for %w", err)
	}
	fs.Close(id)
	var errs []error
	for _, p := range fs.Paths(id) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
