package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/berth-sandbox/berth/proto/filesystem"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
)

// fsService implements filesystem.Filesystem. Like envd it acts as the agent
// (root in the sandbox) and hands what it creates to the requesting user.
type fsService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}

// reqPath resolves a request's path against the requesting user's home.
func (f *fsService) reqPath(h interface{ Get(string) string }, p string) (string, *user, error) {
	u, err := f.s.userFor("", h.Get("Authorization"))
	if err != nil {
		return "", nil, err
	}
	abs, err := resolvePath(p, u.Home)
	if err != nil {
		return "", nil, err
	}
	return abs, u, nil
}

// entryInfo describes path (not following a final symlink), as envd's Stat.
func (s *Server) entryInfo(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return s.entryFromInfo(path, path, fi), nil
}

// entryFromInfo describes the file at real (whose Lstat is fi) under the
// path the client knows it by, shown.
func (s *Server) entryFromInfo(shown, real string, fi fs.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Path:         shown,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		if target, ok := symlinkTarget(real); ok {
			e.SymlinkTarget = &target
		}
	case fi.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode().IsRegular():
		e.Type = pb.FileType_FILE_TYPE_FILE
	default:
		// FIFOs, sockets and devices are not files: the wire (envd's)
		// has no type for them, so they go out unspecified and the
		// permissions string ("prw-r--r--") names the kind. A client that
		// took them for files would block reading a FIFO forever.
		e.Type = pb.FileType_FILE_TYPE_UNSPECIFIED
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = idName(s.cfg.PasswdPath, st.Uid)
		e.Group = idName(s.cfg.GroupPath, st.Gid)
	}
	e.Metadata = readMetadata(real)
	return e
}

// symlinkTarget is where the link at path leads, absolute, as envd reports
// it: fully resolved when the chain resolves, else the link's own target
// made absolute against the link's directory (a dangling link). The agent
// runs in the sandbox's mount namespace, so resolving never leaves the
// sandbox's tree.
func symlinkTarget(path string) (string, bool) {
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		return resolved, true
	}
	target, err := os.Readlink(path)
	if err != nil {
		return "", false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	return filepath.Clean(target), true
}

func (f *fsService) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	path, _, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	e, err := f.s.entryInfo(path)
	if err != nil {
		return nil, rpcErr(fmt.Errorf("stat %q: %w", path, err))
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (f *fsService) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	path, u, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q already exists and is not a directory", path))
	}
	if err := ensureDirs(path, u); err != nil {
		return nil, rpcErr(err)
	}
	e, err := f.s.entryInfo(path)
	if err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// ensureDirs creates path and missing parents, each owned by u.
func ensureDirs(path string, u *user) error {
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%q is not a directory: %w", p, errInvalid)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat %q: %w", p, err)
		}
		missing = append(missing, p)
		if p == "/" || p == "." {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("mkdir %q: %w", missing[i], err)
		}
		if err := os.Lchown(missing[i], int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("chown %q: %w", missing[i], err)
		}
	}
	return nil
}

func (f *fsService) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	src, u, err := f.reqPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, rpcErr(err)
	}
	dst, err := resolvePath(req.Msg.GetDestination(), u.Home)
	if err != nil {
		return nil, rpcErr(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, rpcErr(fmt.Errorf("source %q: %w", src, err))
	}
	if err := ensureDirs(filepath.Dir(dst), u); err != nil {
		return nil, rpcErr(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, rpcErr(fmt.Errorf("move %q to %q: %w", src, dst, err))
	}
	e, err := f.s.entryInfo(dst)
	if err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (f *fsService) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	path, _, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	// Like envd, removing what is not there succeeds: the caller wanted it
	// gone and it is.
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, rpcErr(fmt.Errorf("remove %q: %w", path, err))
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func (f *fsService) ListDir(_ context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	path, _, err := f.reqPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcErr(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	// The listed directory itself may be a symlink to a directory.
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, rpcErr(fmt.Errorf("list %q: %w", path, err))
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, rpcErr(fmt.Errorf("list %q: %w", path, err))
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", path))
	}
	res := &pb.ListDirResponse{}
	var walk func(dir, shown string, level int) error
	walk = func(dir, shown string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, de := range ents {
			info, err := de.Info()
			if err != nil {
				continue // vanished meanwhile
			}
			p := filepath.Join(shown, de.Name())
			res.Entries = append(res.Entries, f.s.entryFromInfo(p, filepath.Join(dir, de.Name()), info))
			// Symlinked directories are listed, not entered: no loops.
			if de.IsDir() && level < depth {
				if err := walk(filepath.Join(dir, de.Name()), p, level+1); err != nil && !errors.Is(err, os.ErrPermission) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, path, 1); err != nil {
		return nil, rpcErr(fmt.Errorf("list %q: %w", path, err))
	}
	return connect.NewResponse(res), nil
}
