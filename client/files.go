package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/filesystem"
)

// FileType is the kind of a directory entry.
type FileType string

// File types.
const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	// FIFOs, sockets and devices: listed, never read (the agent refuses;
	// reading a FIFO would wait for a writer).
	TypeFIFO    FileType = "fifo"
	TypeSocket  FileType = "socket"
	TypeDevice  FileType = "device"
	TypeUnknown FileType = ""
)

// EntryInfo describes a file in a sandbox.
type EntryInfo struct {
	Name          string      `json:"name"`
	Path          string      `json:"path"`
	Type          FileType    `json:"type"`
	Size          int64       `json:"size"`
	Mode          fs.FileMode `json:"mode"`
	Permissions   string      `json:"permissions,omitempty"`
	Owner         string      `json:"owner,omitempty"`
	Group         string      `json:"group,omitempty"`
	ModTime       time.Time   `json:"mod_time"`
	SymlinkTarget string      `json:"symlink_target,omitempty"`
}

// IsDir reports whether the entry is a directory.
func (e EntryInfo) IsDir() bool { return e.Type == TypeDir }

// FileEvent is a change WatchDir saw.
type FileEvent struct {
	// Name is the path of the changed entry relative to the watched
	// directory.
	Name string `json:"name"`
	// Op is one of "create", "write", "remove", "rename", "chmod".
	Op    string     `json:"op"`
	Entry *EntryInfo `json:"entry,omitempty"`
}

func entryFromProto(e *filesystem.EntryInfo) EntryInfo {
	if e == nil {
		return EntryInfo{}
	}
	out := EntryInfo{
		Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(),
		Mode:        fs.FileMode(e.GetMode()),
		Permissions: e.GetPermissions(), Owner: e.GetOwner(), Group: e.GetGroup(),
		SymlinkTarget: e.GetSymlinkTarget(),
	}
	if t := e.GetModifiedTime(); t != nil {
		out.ModTime = t.AsTime()
	}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		out.Type = TypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		out.Type = TypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		out.Type = TypeSymlink
	default:
		// The wire has no type for special files: the first letter of
		// the permissions string (as ls -l prints it) names them.
		if p := e.GetPermissions(); p != "" {
			switch p[0] {
			case 'p':
				out.Type = TypeFIFO
			case 'S':
				out.Type = TypeSocket
			case 'D', 'c':
				out.Type = TypeDevice
			}
		}
	}
	return out
}

func opName(t filesystem.EventType) string {
	switch t {
	case filesystem.EventType_EVENT_TYPE_CREATE:
		return "create"
	case filesystem.EventType_EVENT_TYPE_WRITE:
		return "write"
	case filesystem.EventType_EVENT_TYPE_REMOVE:
		return "remove"
	case filesystem.EventType_EVENT_TYPE_RENAME:
		return "rename"
	case filesystem.EventType_EVENT_TYPE_CHMOD:
		return "chmod"
	}
	return "unknown"
}

// filesURL is the agent's raw file endpoint for path, acting as user.
func (s *Sandbox) filesURL(path, user string) (string, error) {
	c, err := s.client()
	if err != nil {
		return "", err
	}
	if path == "" {
		return "", fmt.Errorf("path is empty: %w", errdefs.ErrInvalidArgument)
	}
	q := url.Values{"path": {path}, "username": {user}}
	return c.agentBase(s.ID) + "/files?" + q.Encode(), nil
}

// ReadFile copies the file at path in the sandbox to w, streaming.
func (s *Sandbox) ReadFile(ctx context.Context, path string, w io.Writer) error {
	resp, err := s.getFile(ctx, path, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("read %s: %w", path, decodeError(resp))
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// getFile sends the agent a GET of the file at path, with a Range header
// when rng is set.
func (s *Sandbox) getFile(ctx context.Context, path, rng string) (*http.Response, error) {
	user := s.userOr("")
	u, err := s.filesURL(path, user)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	req.Header.Set("Authorization", basicUser(user))
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := s.c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, s.c.unreachable(err))
	}
	return resp, nil
}

// ReadFileRange copies at most n bytes of the file at path, from byte
// offset on, to w (n <= 0: to the end). An offset at or past the end copies
// nothing. Followers of a growing file (a log) read only what is new.
func (s *Sandbox) ReadFileRange(ctx context.Context, path string, offset, n int64, w io.Writer) error {
	if offset < 0 {
		return fmt.Errorf("read %s: offset %d: %w", path, offset, errdefs.ErrInvalidArgument)
	}
	rng := fmt.Sprintf("bytes=%d-", offset)
	if n > 0 {
		rng += strconv.FormatInt(offset+n-1, 10)
	}
	resp, err := s.getFile(ctx, path, rng)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body := io.Reader(resp.Body)
	switch {
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		// Nothing at offset: the file is no longer than that.
		return nil
	case resp.StatusCode == http.StatusOK:
		// The whole file, the range ignored: skip to offset.
		if _, err := io.CopyN(io.Discard, resp.Body, offset); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read %s: %w", path, err)
		}
		if n > 0 {
			body = io.LimitReader(resp.Body, n)
		}
	case resp.StatusCode != http.StatusPartialContent:
		return fmt.Errorf("read %s: %w", path, decodeError(resp))
	}
	if _, err := io.Copy(w, body); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// WriteFile stores everything r yields at path in the sandbox, creating
// parent directories and replacing an existing file. It streams: memory use
// does not grow with the file.
func (s *Sandbox) WriteFile(ctx context.Context, path string, r io.Reader) error {
	user := s.userOr("")
	u, err := s.filesURL(path, user)
	if err != nil {
		return err
	}
	// Through a pipe so the request is chunked whatever r is: the body is
	// never buffered, and a Content-Length is never guessed.
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, r)
		pw.CloseWithError(err)
	}()
	// Closing the read side unblocks the copier if the request ends early.
	defer pr.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, pr)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", basicUser(user))
	resp, err := s.c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, s.c.unreachable(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("write %s: %w", path, decodeError(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return nil
}

// Stat describes the entry at path.
func (s *Sandbox) Stat(ctx context.Context, path string) (EntryInfo, error) {
	fc, err := s.filesystemClient()
	if err != nil {
		return EntryInfo{}, err
	}
	req := connect.NewRequest(&filesystem.StatRequest{Path: path})
	req.Header().Set("Authorization", basicUser(s.userOr("")))
	resp, err := fc.Stat(ctx, req)
	if err != nil {
		return EntryInfo{}, fmt.Errorf("stat %s: %w", path, agentError(err))
	}
	return entryFromProto(resp.Msg.GetEntry()), nil
}

// ListDir lists the directory at path. depth 1 lists its entries, 2 also
// their children, and so on; 0 means 1.
func (s *Sandbox) ListDir(ctx context.Context, path string, depth int) ([]EntryInfo, error) {
	fc, err := s.filesystemClient()
	if err != nil {
		return nil, err
	}
	if depth <= 0 {
		depth = 1
	}
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(depth)})
	req.Header().Set("Authorization", basicUser(s.userOr("")))
	resp, err := fc.ListDir(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, agentError(err))
	}
	out := make([]EntryInfo, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryFromProto(e))
	}
	return out, nil
}

// MakeDir creates the directory path and its parents. It fails with
// errdefs.ErrAlreadyExists when path exists.
func (s *Sandbox) MakeDir(ctx context.Context, path string) (EntryInfo, error) {
	fc, err := s.filesystemClient()
	if err != nil {
		return EntryInfo{}, err
	}
	req := connect.NewRequest(&filesystem.MakeDirRequest{Path: path})
	req.Header().Set("Authorization", basicUser(s.userOr("")))
	resp, err := fc.MakeDir(ctx, req)
	if err != nil {
		return EntryInfo{}, fmt.Errorf("mkdir %s: %w", path, agentError(err))
	}
	return entryFromProto(resp.Msg.GetEntry()), nil
}

// Move renames src to dst.
func (s *Sandbox) Move(ctx context.Context, src, dst string) (EntryInfo, error) {
	fc, err := s.filesystemClient()
	if err != nil {
		return EntryInfo{}, err
	}
	req := connect.NewRequest(&filesystem.MoveRequest{Source: src, Destination: dst})
	req.Header().Set("Authorization", basicUser(s.userOr("")))
	resp, err := fc.Move(ctx, req)
	if err != nil {
		return EntryInfo{}, fmt.Errorf("move %s to %s: %w", src, dst, agentError(err))
	}
	return entryFromProto(resp.Msg.GetEntry()), nil
}

// Remove deletes path, recursively for a directory.
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	fc, err := s.filesystemClient()
	if err != nil {
		return err
	}
	req := connect.NewRequest(&filesystem.RemoveRequest{Path: path})
	req.Header().Set("Authorization", basicUser(s.userOr("")))
	if _, err := fc.Remove(ctx, req); err != nil {
		return fmt.Errorf("remove %s: %w", path, agentError(err))
	}
	return nil
}

// WatchDir calls fn for each change under the directory path (and below it
// if recursive) until ctx ends (returning ctx's error), the agent ends the
// stream (nil), or fn returns an error (which WatchDir returns).
func (s *Sandbox) WatchDir(ctx context.Context, path string, recursive bool, fn func(FileEvent) error) error {
	return s.WatchDirNotify(ctx, path, recursive, nil, fn)
}

// WatchDirNotify is WatchDir that also calls ready (if non-nil) once the
// watch is in place: changes made after ready returns are seen.
func (s *Sandbox) WatchDirNotify(ctx context.Context, path string, recursive bool, ready func(), fn func(FileEvent) error) error {
	fc, err := s.filesystemClient()
	if err != nil {
		return err
	}
	req := connect.NewRequest(&filesystem.WatchDirRequest{Path: path, Recursive: recursive, IncludeEntry: true})
	setHeaders(req.Header(), s.userOr(""))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fc.WatchDir(ctx, req)
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, agentError(err))
	}
	defer stream.Close()
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().(type) {
		case *filesystem.WatchDirResponse_Start:
			if ready != nil {
				ready()
			}
		case *filesystem.WatchDirResponse_Filesystem:
			ev := FileEvent{Name: e.Filesystem.GetName(), Op: opName(e.Filesystem.GetType())}
			if pe := e.Filesystem.GetEntry(); pe != nil {
				ent := entryFromProto(pe)
				ev.Entry = &ent
			}
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := stream.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", path, agentError(err))
	}
	return nil
}
