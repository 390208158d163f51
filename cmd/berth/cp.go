package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// cpArg is one side of "berth cp": a local path, or a path in a sandbox.
type cpArg struct {
	id   string // empty for a local path
	path string
}

// parseCpArg reads "ID:PATH" as a path in sandbox ID and anything else as a
// local path. A prefix is taken as an ID only when it looks like one (lower
// case letters and digits); local paths that do anyway ("foo:bar") must be
// written "./foo:bar". Paths starting with "/" or "." are always local.
func parseCpArg(s string) cpArg {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return cpArg{path: s}
	}
	id, p, ok := strings.Cut(s, ":")
	if !ok || !isSandboxID(id) {
		return cpArg{path: s}
	}
	return cpArg{id: id, path: p}
}

func isSandboxID(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// parseCpArgs checks that exactly one side is in a sandbox.
func parseCpArgs(src, dst string) (from, to cpArg, err error) {
	from, to = parseCpArg(src), parseCpArg(dst)
	switch {
	case from.id != "" && to.id != "":
		return from, to, invalidf("cannot copy between sandboxes; copy through a local path")
	case from.id == "" && to.id == "":
		return from, to, invalidf("one of SRC and DST must be ID:PATH")
	case from.path == "" || to.path == "":
		return from, to, invalidf("empty path in %q %q", src, dst)
	}
	return from, to, nil
}

func newCpCmd(a *app) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC ID:DST | cp ID:SRC DST",
		Short: "Copy files and directories into or out of a sandbox",
		Long: `Copy a file or a directory tree between the local machine and a sandbox,
keeping permission bits and symbolic links. As with cp -r, when DST is an
existing directory SRC is copied into it under its own name.

A local path containing ':' must start with "./" or "/" so it is not read as
ID:PATH.`,
		Args: exactArgs(2, "SRC and DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, to, err := parseCpArgs(args[0], args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if to.id != "" {
				sb := c.Sandbox(to.id)
				if user != "" {
					sb = sb.As(user)
				}
				return upload(cmd.Context(), sb, from.path, to.path, a.err)
			}
			sb := c.Sandbox(from.id)
			if user != "" {
				sb = sb.As(user)
			}
			info, err := c.Get(cmd.Context(), from.id)
			if err != nil {
				return err
			}
			return download(cmd.Context(), sb, dataBudget(info), from.path, to.path, a.err)
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user to read and write files as (default root)")
	return cmd
}

// chmodOp is a mode to set on a path once copying is done.
type chmodOp struct {
	mode fs.FileMode
	path string
}

// upload copies local src to dst in the sandbox.
func upload(ctx context.Context, sb *client.Sandbox, src, dst string, warn io.Writer) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("cp: %w", localErr(err))
	}
	target := dst
	st, err := sb.Stat(ctx, dst)
	switch {
	case err == nil && st.IsDir():
		target = path.Join(dst, filepath.Base(src))
	case err == nil:
	case errors.Is(err, errdefs.ErrNotFound):
		if strings.HasSuffix(dst, "/") {
			target = path.Join(dst, filepath.Base(src))
		}
	default:
		return err
	}

	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			// Reading a FIFO would wait for a writer forever.
			return fmt.Errorf("cp: %s is not a regular file, directory or symlink: %w", src, errdefs.ErrInvalidArgument)
		}
		if err := uploadFile(ctx, sb, src, target); err != nil {
			return err
		}
		return remoteChmod(ctx, sb, []chmodOp{{fi.Mode().Perm(), target}})
	}

	var files, dirs []chmodOp
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return localErr(err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		rp := path.Join(target, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return localErr(err)
		}
		switch {
		case d.IsDir():
			if _, err := sb.MakeDir(ctx, rp); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
				return err
			}
			dirs = append(dirs, chmodOp{info.Mode().Perm(), rp})
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return localErr(err)
			}
			return remoteRun(ctx, sb, "ln", "-sfn", link, rp)
		case d.Type().IsRegular():
			if err := uploadFile(ctx, sb, p, rp); err != nil {
				return err
			}
			files = append(files, chmodOp{info.Mode().Perm(), rp})
		default:
			fmt.Fprintf(warn, "berth: skipping %s: not a file, directory or symlink\n", p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	// Directories last and deepest first, so a directory made read-only
	// does not stop its contents from being changed.
	slices.Reverse(dirs)
	return remoteChmod(ctx, sb, append(files, dirs...))
}

func uploadFile(ctx context.Context, sb *client.Sandbox, src, dst string) error {
	// O_NONBLOCK and a check of what was opened: a FIFO swapped in after
	// the walk looked must not block the copy.
	f, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return localErr(err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: %w", src, errdefs.ErrInvalidArgument)
	}
	return sb.WriteFile(ctx, dst, f)
}

// chmodBatch bounds the paths per chmod command line.
const chmodBatch = 200

// remoteChmod sets modes in the sandbox. The file API has no chmod, so it
// runs chmod there, one command per run of equal modes.
func remoteChmod(ctx context.Context, sb *client.Sandbox, ops []chmodOp) error {
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && j-i < chmodBatch && ops[j].mode == ops[i].mode {
			j++
		}
		args := []string{strconv.FormatUint(uint64(ops[i].mode), 8)}
		for _, op := range ops[i:j] {
			args = append(args, op.path)
		}
		if err := remoteRun(ctx, sb, "chmod", args...); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// remoteRun runs a helper command in the sandbox and fails with its stderr.
func remoteRun(ctx context.Context, sb *client.Sandbox, cmd string, args ...string) error {
	var stderr bytes.Buffer
	code, err := sb.Exec(ctx, client.ExecRequest{Cmd: cmd, Args: args, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("cp: %s: %w", cmd, err)
	}
	if code != 0 {
		return fmt.Errorf("cp: %s exited %d: %s", cmd, code, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// listDepth is how deep a directory download looks.
const listDepth = 256

// download copies src in the sandbox to local dst.
func download(ctx context.Context, sb *client.Sandbox, budget *int64, src, dst string, warn io.Writer) error {
	st, err := sb.Stat(ctx, src)
	if err != nil {
		return err
	}
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		target = filepath.Join(dst, path.Base(st.Path))
	} else if err != nil && strings.HasSuffix(dst, string(filepath.Separator)) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("cp: %w", localErr(err))
		}
		target = filepath.Join(dst, path.Base(st.Path))
	}
	if !st.IsDir() {
		if st.Type != client.TypeFile && st.Type != client.TypeSymlink {
			return fmt.Errorf("cp: %s is a %s, not a regular file: %w", st.Path, kindName(st), errdefs.ErrInvalidArgument)
		}
		return downloadFile(ctx, sb, budget, st.Path, target, st.Mode.Perm())
	}

	entries, err := sb.ListDir(ctx, st.Path, listDepth)
	if err != nil {
		return err
	}
	// Parents sort before their children.
	slices.SortFunc(entries, func(x, y client.EntryInfo) int { return strings.Compare(x.Path, y.Path) })
	if err := os.MkdirAll(target, 0o700); err != nil {
		return fmt.Errorf("cp: %w", localErr(err))
	}
	prefix := strings.TrimSuffix(st.Path, "/") + "/"
	dirs := []chmodOp{{st.Mode.Perm(), target}}
	var links []client.EntryInfo
	for _, e := range entries {
		rel, ok := strings.CutPrefix(e.Path, prefix)
		if !ok || !filepath.IsLocal(filepath.FromSlash(rel)) {
			return fmt.Errorf("cp: sandbox listed %q outside %q: %w", e.Path, st.Path, errdefs.ErrFailedPrecondition)
		}
		lp := filepath.Join(target, filepath.FromSlash(rel))
		switch e.Type {
		case client.TypeDir:
			if err := os.MkdirAll(lp, 0o700); err != nil {
				return fmt.Errorf("cp: %w", localErr(err))
			}
			dirs = append(dirs, chmodOp{e.Mode.Perm(), lp})
		case client.TypeFile:
			if err := downloadFile(ctx, sb, budget, e.Path, lp, e.Mode.Perm()); err != nil {
				return err
			}
		case client.TypeSymlink:
			// Made last, so no file is written through a link the
			// sandbox chose. The agent reports targets absolute (as
			// envd does); one inside the copied tree becomes relative
			// again, so the copy's links stay inside the copy.
			if t, ok := strings.CutPrefix(e.SymlinkTarget, prefix); ok && filepath.IsLocal(filepath.FromSlash(t)) {
				if r, err := filepath.Rel(filepath.Dir(filepath.FromSlash(rel)), filepath.FromSlash(t)); err == nil {
					e.SymlinkTarget = r
				}
			}
			e.Path = lp
			links = append(links, e)
		default:
			// A FIFO would block the read forever; a device is not
			// content. Both are named and skipped.
			fmt.Fprintf(warn, "berth: skipping %s: a %s, not a regular file, directory or symlink\n", e.Path, kindName(e))
		}
	}
	for _, l := range links {
		if err := os.Symlink(l.SymlinkTarget, l.Path); err != nil {
			return fmt.Errorf("cp: %w", localErr(err))
		}
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := os.Chmod(d.path, d.mode); err != nil {
			return fmt.Errorf("cp: %w", localErr(err))
		}
	}
	return nil
}

// dataBudget is the most data a download from sb can carry: all its disk
// and all its memory (tmpfs). Holes cost nothing. Nil when the sandbox
// reports no limits.
func dataBudget(sb *client.Sandbox) *int64 {
	if sb.DiskBytes <= 0 || sb.MemoryBytes <= 0 {
		return nil
	}
	n := sb.DiskBytes + sb.MemoryBytes
	return &n
}

func downloadFile(ctx context.Context, sb *client.Sandbox, budget *int64, src, dst string, mode fs.FileMode) error {
	// O_NOFOLLOW: never write through a symlink at the destination itself.
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("cp: %w", localErr(err))
	}
	// Runs of zeros become holes, as cp --sparse does: a sparse file
	// (1 GiB apparent in a 64 MiB sandbox) takes on the host no more
	// than the data the sandbox could store.
	sw := &sparseWriter{f: f, budget: budget}
	if err := sb.ReadFile(ctx, src, sw); err != nil {
		f.Close()
		if errors.Is(err, errBudget) {
			return fmt.Errorf("cp: %s: %w: %w", src, err, errdefs.ErrResourceExhausted)
		}
		return err
	}
	if err := sw.finish(); err != nil {
		f.Close()
		if errors.Is(err, errBudget) {
			return fmt.Errorf("cp: %s: %w: %w", src, err, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("cp: %w", localErr(err))
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("cp: %w", localErr(err))
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cp: %w", localErr(err))
	}
	return nil
}

// kindName names an entry's type for messages.
func kindName(e client.EntryInfo) string {
	switch e.Type {
	case client.TypeFIFO:
		return "FIFO"
	case client.TypeSocket:
		return "socket"
	case client.TypeDevice:
		return "device"
	}
	return "special file"
}

// localErr classes local file errors so they print with a useful code.
func localErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
	}
	return err
}
