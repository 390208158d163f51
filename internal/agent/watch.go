package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	pb "github.com/berth-sandbox/berth/proto/filesystem"
)

// maxPolledEvents bounds what a polling watcher keeps between two
// GetWatcherEvents calls; older events are dropped first.
const maxPolledEvents = 10000

// dirWatch is one fsnotify watcher over a directory (and its subdirectories
// when recursive), producing envd-style events with names relative to root.
type dirWatch struct {
	s         *Server
	root      string
	recursive bool
	entry     bool
	w         *fsnotify.Watcher
}

func (s *Server) newDirWatch(root string, recursive, entry bool) (*dirWatch, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("watch %q: %w", root, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("watch %q: not a directory: %w", root, errInvalid)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %q: %w", root, err)
	}
	d := &dirWatch{s: s, root: root, recursive: recursive, entry: entry, w: w}
	if err := d.add(root); err != nil {
		w.Close()
		return nil, err
	}
	return d, nil
}

func (d *dirWatch) add(dir string) error {
	if !d.recursive {
		return d.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if de.IsDir() {
			if err := d.w.Add(p); err != nil && p == dir {
				return fmt.Errorf("watch %q: %w", p, err)
			}
		}
		return nil
	})
}

// run delivers events to emit until ctx ends or the watcher fails.
func (d *dirWatch) run(ctx context.Context, emit func(*pb.FilesystemEvent)) error {
	defer d.w.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-d.w.Errors:
			if !ok {
				return nil
			}
			return err
		case ev, ok := <-d.w.Events:
			if !ok {
				return nil
			}
			if d.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = d.add(ev.Name)
				}
			}
			name, err := filepath.Rel(d.root, ev.Name)
			if err != nil {
				name = ev.Name
			}
			for _, t := range eventTypes(ev.Op) {
				fe := &pb.FilesystemEvent{Name: name, Type: t}
				if d.entry && t != pb.EventType_EVENT_TYPE_REMOVE && t != pb.EventType_EVENT_TYPE_RENAME {
					if e, err := d.s.entryInfo(ev.Name); err == nil {
						fe.Entry = e
					}
				}
				emit(fe)
			}
		}
	}
}

func eventTypes(op fsnotify.Op) []pb.EventType {
	var out []pb.EventType
	for _, m := range []struct {
		op fsnotify.Op
		t  pb.EventType
	}{
		{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
		{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
	} {
		if op.Has(m.op) {
			out = append(out, m.t)
		}
	}
	return out
}

func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	path, _, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return rpcErr(err)
	}
	d, err := f.s.newDirWatch(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return rpcErr(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	send := func(r *pb.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	if err := send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		d.w.Close()
		return err
	}
	go func() {
		tick := time.NewTicker(f.s.keepaliveInterval(req.Header()))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}) != nil {
					cancel()
					return
				}
			}
		}
	}()
	var sendErr error
	err = d.run(ctx, func(fe *pb.FilesystemEvent) {
		if sendErr == nil {
			if sendErr = send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: fe}}); sendErr != nil {
				cancel()
			}
		}
	})
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %q: %w", path, err))
	}
	return nil
}

// watcherSet holds the polling watchers (CreateWatcher & co.).
type watcherSet struct {
	mu sync.Mutex
	m  map[string]*polledWatch
}

type polledWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	events []*pb.FilesystemEvent
	err    error
}

func newWatcherSet() *watcherSet { return &watcherSet{m: map[string]*polledWatch{}} }

func (ws *watcherSet) closeAll() {
	ws.mu.Lock()
	all := ws.m
	ws.m = map[string]*polledWatch{}
	ws.mu.Unlock()
	for _, w := range all {
		w.cancel()
		<-w.done
	}
}

func (f *fsService) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	path, _, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	d, err := f.s.newDirWatch(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, rpcErr(err)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ctx, cancel := context.WithCancel(context.Background())
	pw := &polledWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(pw.done)
		err := d.run(ctx, func(fe *pb.FilesystemEvent) {
			pw.mu.Lock()
			if len(pw.events) >= maxPolledEvents {
				pw.events = pw.events[1:]
			}
			pw.events = append(pw.events, fe)
			pw.mu.Unlock()
		})
		pw.mu.Lock()
		pw.err = err
		pw.mu.Unlock()
	}()
	ws := f.s.watches
	ws.mu.Lock()
	ws.m[id] = pw
	ws.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *fsService) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	ws := f.s.watches
	ws.mu.Lock()
	pw, ok := ws.m[req.Msg.GetWatcherId()]
	ws.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	pw.mu.Lock()
	evs, werr := pw.events, pw.err
	pw.events = nil
	pw.mu.Unlock()
	if werr != nil && len(evs) == 0 {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("watcher %q: %w", req.Msg.GetWatcherId(), werr))
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *fsService) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	ws := f.s.watches
	ws.mu.Lock()
	pw, ok := ws.m[req.Msg.GetWatcherId()]
	delete(ws.m, req.Msg.GetWatcherId())
	ws.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher "+req.Msg.GetWatcherId()+" not found"))
	}
	pw.cancel()
	<-pw.done
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
