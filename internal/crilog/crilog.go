// Package crilog writes and reads container logs in the format the CRI
// gives the kubelet: one record per line,
//
//	<time, RFC 3339 with nanoseconds> <stdout|stderr> <F|P> <content>
//
// where F ends a line of the container's output and P is a piece of a line
// longer than MaxLine, continued by the next record of the stream. Records
// carry the time each piece was read, which `kubectl logs --since` and
// `--timestamps` need. Beside a log it defines the run record, which run
// of a restarted container wrote it, and the suffix a previous run's files
// are kept under. It is a leaf: the agent links it to write the log
// inside the sandbox, the Kubernetes node to read it back.
package crilog

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"
)

// Streams a record names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Previous is the suffix of the files a container's previous run left:
// a restart keeps one previous log per container (with its exit code and
// run record), as the kubelet does, for `kubectl logs --previous`.
const Previous = ".previous"

// MaxLine is the longest content of one record, as the kubelet's 16 KiB:
// longer lines are written as P records and a final F.
const MaxLine = 16 << 10

// Record is one line of a log file.
type Record struct {
	Time   time.Time
	Stream string
	// Partial is a P record: the line goes on in the stream's next record.
	Partial bool
	// Content is the output without the line's newline.
	Content []byte
}

// Append appends r as a record line, with its newline, to b.
func (r Record) Append(b []byte) []byte {
	b = r.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, ' ')
	b = append(b, r.Stream...)
	if r.Partial {
		b = append(b, " P "...)
	} else {
		b = append(b, " F "...)
	}
	b = append(b, r.Content...)
	return append(b, '\n')
}

// Parse reads one record line, without its newline. Content aliases line.
func Parse(line []byte) (Record, error) {
	var r Record
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return r, errNotRecord
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return r, errNotRecord
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != Stdout && string(stream) != Stderr) {
		return r, errNotRecord
	}
	tag, content, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(tag) != "F" && string(tag) != "P") {
		return r, errNotRecord
	}
	return Record{Time: t, Stream: string(stream), Partial: string(tag) == "P", Content: content}, nil
}

var errNotRecord = errors.New("not a CRI log record")

// Run is the record of one run of a container: how many restarts came
// before it and when it started. It is one line,
//
//	<restarts> <time, RFC 3339 with nanoseconds>
type Run struct {
	Restart int
	Started time.Time
}

// Append appends r as its line, with the newline, to b.
func (r Run) Append(b []byte) []byte {
	b = strconv.AppendInt(b, int64(r.Restart), 10)
	b = append(b, ' ')
	b = r.Started.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '\n')
}

// ParseRun reads a run record, with or without its newline.
func ParseRun(b []byte) (Run, error) {
	n, ts, ok := bytes.Cut(bytes.TrimSuffix(b, []byte{'\n'}), []byte{' '})
	if !ok {
		return Run{}, errNotRun
	}
	restart, err := strconv.Atoi(string(n))
	if err != nil || restart < 0 || string(n) != strconv.Itoa(restart) {
		return Run{}, errNotRun
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return Run{}, errNotRun
	}
	return Run{Restart: restart, Started: t}, nil
}

var errNotRun = errors.New("not a container run record")

// Writer writes the records of a container's streams to one log. Each
// record is one Write, so records of two streams never interleave.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
	buf []byte
}

// NewWriter writes records to w, timed with now.
func NewWriter(w io.Writer, now func() time.Time) *Writer {
	return &Writer{w: w, now: now}
}

// Copy writes what r yields as records of stream until r ends (nil) or a
// read or write fails. A last line without a newline is written as an F
// record, as the CRI runtimes do.
func (w *Writer) Copy(stream string, r io.Reader) error {
	br := bufio.NewReaderSize(r, MaxLine)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			if werr := w.write(stream, false, line[:len(line)-1]); werr != nil {
				return werr
			}
		case errors.Is(err, bufio.ErrBufferFull):
			if werr := w.write(stream, true, line); werr != nil {
				return werr
			}
		default:
			if len(line) > 0 {
				if werr := w.write(stream, false, line); werr != nil {
					return werr
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// write writes one record of stream.
func (w *Writer) write(stream string, partial bool, content []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = Record{Time: w.now(), Stream: stream, Partial: partial, Content: content}.Append(w.buf[:0])
	_, err := w.w.Write(w.buf)
	return err
}
