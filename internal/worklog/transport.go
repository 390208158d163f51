package worklog

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/proto/process"
)

// Transport wraps next so that requests marked with WithSandbox and bound
// for the agent's port are recorded. Bytes pass through as they come: the
// response stream is parsed from a copy as it is read, with bounded memory,
// and nothing is held back.
func (l *Log) Transport(next http.RoundTripper) http.RoundTripper {
	return &transport{l: l, next: next, port: strconv.Itoa(l.cfg.AgentPort)}
}

type transport struct {
	l    *Log
	next http.RoundTripper
	port string
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	o, ok := originOf(r)
	if !ok || r.URL.Port() != t.port {
		return t.next.RoundTrip(r)
	}
	switch p := r.URL.Path; {
	case p == "/process.Process/Start" && r.Method == http.MethodPost:
		return t.process(r, o, KindExec)
	case p == "/process.Process/Connect" && r.Method == http.MethodPost:
		return t.process(r, o, KindAttach)
	case p == "/files" && r.Method == http.MethodPost:
		return t.upload(r, o)
	case r.Method == http.MethodPost && (p == "/filesystem.Filesystem/MakeDir" || p == "/filesystem.Filesystem/Move" || p == "/filesystem.Filesystem/Remove"):
		return t.fsOp(r, o)
	}
	return t.next.RoundTrip(r)
}

// basicUser is the user a request names in Authorization: Basic.
func basicUser(r *http.Request) string {
	u, _, _ := r.BasicAuth()
	return u
}

// streamCodec reads a Connect streaming content type; ok is false for
// anything else (gRPC, gRPC-Web), which passes unrecorded in detail.
func streamCodec(h http.Header) (codec, bool) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	c := codec{gzip: strings.EqualFold(h.Get("Connect-Content-Encoding"), "gzip")}
	switch mt {
	case "application/connect+proto":
		return c, true
	case "application/connect+json":
		c.json = true
		return c, true
	}
	return c, false
}

// process records a Start or Connect call: the request's one enveloped
// message is read (it is complete before any answer), the response stream
// is parsed as it passes.
func (t *transport) process(r *http.Request, o origin, kind string) (*http.Response, error) {
	e := Entry{ID: newID(), Time: time.Now(), Sandbox: o.sandbox, API: o.api, Kind: kind, User: basicUser(r)}
	reqCodec, ok := streamCodec(r.Header)
	if ok && r.Body != nil {
		var msg []byte
		var flags byte
		r, msg, flags = peekEnvelope(r)
		if msg != nil {
			describe(&e, kind, reqCodec, flags, msg)
		}
	}
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		e.Error = err.Error()
		e.End = time.Now()
		t.l.Append(e)
		return resp, err
	}
	respCodec, ok := streamCodec(resp.Header)
	if !ok || resp.StatusCode != http.StatusOK {
		e.HTTPStatus = resp.StatusCode
		e.Error = "agent answered " + resp.Status
		e.End = time.Now()
		t.l.Append(e)
		return resp, nil
	}
	rec := &execRecorder{l: t.l, e: e, codec: respCodec}
	rec.parser.onMsg = rec.onMsg
	resp.Body = &teeBody{rc: resp.Body, w: &rec.parser, done: rec.finish}
	return resp, nil
}

// peekEnvelope reads the first envelope of r's body and gives back a
// request whose body still yields every byte.
func peekEnvelope(r *http.Request) (*http.Request, []byte, byte) {
	var hdr [5]byte
	n, err := io.ReadFull(r.Body, hdr[:])
	consumed := hdr[:n]
	var msg []byte
	if err == nil {
		size := int(uint32(hdr[1])<<24 | uint32(hdr[2])<<16 | uint32(hdr[3])<<8 | uint32(hdr[4]))
		if size <= maxMessage {
			buf := make([]byte, size)
			m, err := io.ReadFull(r.Body, buf)
			consumed = append(consumed[:n:n], buf[:m]...)
			if err == nil {
				msg = buf
			}
		}
	}
	r2 := r.Clone(r.Context())
	r2.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(consumed), r.Body), r.Body}
	return r2, msg, hdr[0]
}

func describe(e *Entry, kind string, c codec, flags byte, msg []byte) {
	if kind == KindAttach {
		var req process.ConnectRequest
		if c.unmarshal(flags, msg, &req) == nil {
			if s := req.GetProcess(); s != nil {
				e.PID = s.GetPid()
				e.Tag = s.GetTag()
			}
		}
		return
	}
	var req process.StartRequest
	if c.unmarshal(flags, msg, &req) != nil {
		return
	}
	p := req.GetProcess()
	e.Cmd = p.GetCmd()
	e.Args = p.GetArgs()
	e.Cwd = p.GetCwd()
	for k := range p.GetEnvs() {
		e.EnvNames = append(e.EnvNames, k)
	}
	slices.Sort(e.EnvNames)
	e.Tag = req.GetTag()
	e.PTY = req.Pty != nil
}

// execRecorder follows one process event stream.
type execRecorder struct {
	l      *Log
	codec  codec
	parser envelopeParser

	mu  sync.Mutex
	e   Entry
	out [3]capture // stdout, stderr, pty
	// endWritten: the entry was written at the end event; changed: the
	// stream added to it since (so finish writes it again).
	endWritten, changed bool
	once                sync.Once
}

// write appends the entry with the output so far; mu is held.
func (x *execRecorder) write() {
	x.e.Stdout, x.e.Stderr, x.e.PTYOut = x.out[0].stream(), x.out[1].stream(), x.out[2].stream()
	x.l.Append(x.e)
	x.changed = false
}

func (x *execRecorder) onMsg(flags byte, msg []byte) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if flags&flagEndStream != 0 {
		var end struct {
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(x.codec.endStream(flags, msg), &end) == nil && end.Error != nil && x.e.Error == "" {
			x.e.Error = strings.TrimSpace(end.Error.Code + ": " + end.Error.Message)
			x.changed = true
		}
		return
	}
	// StartResponse and ConnectResponse are the same message on the wire.
	var resp process.StartResponse
	if x.codec.unmarshal(flags, msg, &resp) != nil {
		return
	}
	ev := resp.GetEvent()
	switch {
	case ev.GetStart() != nil:
		x.e.PID = ev.GetStart().GetPid()
		// Written at once so a long command shows while it runs.
		x.l.Append(x.e)
	case ev.GetData() != nil:
		d := ev.GetData()
		switch d.GetOutput().(type) {
		case *process.ProcessEvent_DataEvent_Stdout:
			x.out[0].add(d.GetStdout())
		case *process.ProcessEvent_DataEvent_Stderr:
			x.out[1].add(d.GetStderr())
		case *process.ProcessEvent_DataEvent_Pty:
			x.out[2].add(d.GetPty())
		}
		x.changed = true
	case ev.GetEnd() != nil:
		end := ev.GetEnd()
		x.e.Done = true
		x.e.End = time.Now()
		x.e.ExitCode = end.GetExitCode()
		x.e.Exited = end.GetExited()
		x.e.Status = end.GetStatus()
		if end.Error != nil {
			x.e.Error = end.GetError()
		}
		// Written now, while the end event is on its way to the client
		// (this runs inside the read that hands it over), so a client
		// that reads the work log once its command ended finds the end
		// there; finish writes the entry again if the stream adds to it.
		x.write()
		x.endWritten = true
	}
}

// finish writes the final entry once the stream ended or was closed.
func (x *execRecorder) finish() {
	x.once.Do(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.endWritten && !x.changed {
			return // written at the end event, and nothing came after it
		}
		if x.e.End.IsZero() {
			x.e.End = time.Now()
		}
		x.write()
	})
}

// teeBody hands every byte read to w as well (w never fails and never
// blocks) and calls done once at EOF, error or Close.
type teeBody struct {
	rc   io.ReadCloser
	w    io.Writer
	done func()
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		_, _ = b.w.Write(p[:n])
	}
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *teeBody) Close() error {
	err := b.rc.Close()
	b.done()
	return err
}

// captureKiB is how much of each end of a stream is kept.
const captureKiB = 1024

type capture struct {
	n          int64
	head, tail []byte
}

func (c *capture) add(b []byte) {
	c.n += int64(len(b))
	if room := captureKiB - len(c.head); room > 0 {
		c.head = append(c.head, b[:min(room, len(b))]...)
	}
	if len(b) >= captureKiB {
		c.tail = append(c.tail[:0], b[len(b)-captureKiB:]...)
		return
	}
	c.tail = append(c.tail, b...)
	if over := len(c.tail) - captureKiB; over > 0 {
		c.tail = c.tail[:copy(c.tail, c.tail[over:])]
	}
}

func (c *capture) stream() Stream {
	if c.n == 0 {
		return Stream{}
	}
	return Stream{Bytes: c.n, Head: c.head, Tail: c.tail}
}

// fsOp records MakeDir, Move and Remove (unary Connect calls with small
// bodies) once the agent has answered.
func (t *transport) fsOp(r *http.Request, o origin) (*http.Response, error) {
	e := Entry{ID: newID(), Time: time.Now(), Sandbox: o.sandbox, API: o.api, User: basicUser(r)}
	name := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	c := codec{json: mt == "application/json"}
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
		r2 := r.Clone(r.Context())
		r2.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		r = r2
		if err != nil || len(body) > maxMessage {
			body = nil
		}
	}
	if body != nil && strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		body = gunzip(body)
	}
	var m proto.Message
	switch name {
	case "MakeDir":
		e.Kind = KindMkdir
		m = &filesystem.MakeDirRequest{}
	case "Move":
		e.Kind = KindMove
		m = &filesystem.MoveRequest{}
	default:
		e.Kind = KindRemove
		m = &filesystem.RemoveRequest{}
	}
	if body != nil && c.unmarshal(0, body, m) == nil {
		switch req := m.(type) {
		case *filesystem.MakeDirRequest:
			e.Path = req.GetPath()
		case *filesystem.MoveRequest:
			e.Path, e.Dest = req.GetSource(), req.GetDestination()
		case *filesystem.RemoveRequest:
			e.Path = req.GetPath()
		}
	}
	resp, err := t.next.RoundTrip(r)
	e.End = time.Now()
	if err != nil {
		e.Error = err.Error()
	} else {
		e.HTTPStatus = resp.StatusCode
	}
	t.l.Append(e)
	return resp, err
}

func gunzip(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxMessage+1))
	if err != nil || len(out) > maxMessage {
		return nil
	}
	return out
}

// upload records POST /files: the requested path, the bytes sent, and the
// paths the agent reports written (read from a bounded copy of its small
// JSON answer).
func (t *transport) upload(r *http.Request, o origin) (*http.Response, error) {
	q := r.URL.Query()
	e := Entry{ID: newID(), Time: time.Now(), Sandbox: o.sandbox, API: o.api, Kind: KindWrite, Path: q.Get("path"), User: q.Get("username")}
	if e.User == "" {
		e.User = basicUser(r)
	}
	cnt := &countingReader{}
	if r.Body != nil {
		r2 := r.Clone(r.Context())
		cnt.r = r.Body
		r2.Body = struct {
			io.Reader
			io.Closer
		}{cnt, r.Body}
		r = r2
	}
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		e.Error = err.Error()
		e.End = time.Now()
		e.Size = cnt.n.Load()
		t.l.Append(e)
		return resp, err
	}
	e.HTTPStatus = resp.StatusCode
	var answer bytes.Buffer
	var once sync.Once
	resp.Body = &teeBody{rc: resp.Body, w: &limitedWriter{w: &answer, n: 64 << 10}, done: func() {
		once.Do(func() {
			e.End = time.Now()
			e.Size = cnt.n.Load()
			var written []struct {
				Path string `json:"path"`
			}
			if e.HTTPStatus == http.StatusOK && json.Unmarshal(answer.Bytes(), &written) == nil {
				for _, w := range written {
					e.Paths = append(e.Paths, w.Path)
				}
			} else if e.HTTPStatus != http.StatusOK {
				e.Error = strings.TrimSpace(answer.String())
				if len(e.Error) > 512 {
					e.Error = e.Error[:512]
				}
			}
			t.l.Append(e)
		})
	}}
	return resp, nil
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
