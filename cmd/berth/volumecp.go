package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// volumeArg is one side of "berth volume cp": VOLUME:/path, or a local
// path (one starting with "/" or "." always is).
type volumeArg struct {
	volume string // empty for a local path
	path   string
}

func parseVolumeArg(s string) volumeArg {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return volumeArg{path: s}
	}
	v, p, ok := strings.Cut(s, ":")
	if !ok || v == "" || !strings.HasPrefix(p, "/") {
		return volumeArg{path: s}
	}
	return volumeArg{volume: v, path: p}
}

func newVolumeCpCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between this machine and a volume (VOLUME:/path), no sandbox needed",
		Long: "Copy a file or a directory tree between this machine and a volume: one side is " +
			"VOLUME:/path (a volume's name or ID), the other a local path. SRC is copied to DST, the " +
			"path it gets there (missing parent directories are made); files keep their permission " +
			"bits, and in the volume belong to the sandboxes' root. Symbolic links are skipped, saying so.",
		Args: exactArgs(2, "SRC and DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, to := parseVolumeArg(args[0]), parseVolumeArg(args[1])
			if (from.volume == "") == (to.volume == "") {
				return invalidf("berth volume cp: exactly one of SRC and DST must be VOLUME:/path")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if to.volume != "" {
				return uploadVolume(cmd.Context(), c, from.path, to, a.err)
			}
			return downloadVolume(cmd.Context(), c, from, to.path, a.err)
		},
	}
}

// uploadVolume copies local src (a file or a tree) to dst in a volume.
func uploadVolume(ctx context.Context, c *client.Client, src string, dst volumeArg, warn io.Writer) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return localErr(err)
	}
	if !fi.IsDir() {
		return uploadVolumeFile(ctx, c, src, fi, dst.volume, dst.path)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return localErr(err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst.path, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return localErr(err)
		}
		switch {
		case d.IsDir():
			_, err := c.MakeVolumeDir(ctx, dst.volume, target, info.Mode().Perm())
			return err
		case info.Mode().IsRegular():
			return uploadVolumeFile(ctx, c, p, info, dst.volume, target)
		default:
			fmt.Fprintf(warn, "skipped %s: a %s, not a file or directory\n", p, kindOf(info.Mode()))
			return nil
		}
	})
}

func uploadVolumeFile(ctx context.Context, c *client.Client, src string, fi fs.FileInfo, volume, dst string) error {
	if !fi.Mode().IsRegular() {
		return invalidf("%s is a %s: berth volume cp copies files and directories", src, kindOf(fi.Mode()))
	}
	f, err := os.Open(src)
	if err != nil {
		return localErr(err)
	}
	defer f.Close()
	_, err = c.WriteVolumeFile(ctx, volume, dst, f, fi.Mode().Perm())
	return err
}

// downloadVolume copies src in a volume (a file or a tree) to local dst.
func downloadVolume(ctx context.Context, c *client.Client, src volumeArg, dst string, warn io.Writer) error {
	root := path.Clean(src.path)
	entries, err := c.ListVolume(ctx, src.volume, root, 1<<16)
	if err != nil {
		return err
	}
	if len(entries) == 1 && entries[0].Path == root && entries[0].Type != "directory" {
		// A file lists as its own entry.
		if entries[0].Type != "file" {
			return invalidf("%s:%s is a %s: berth volume cp copies files and directories", src.volume, root, entries[0].Type)
		}
		return downloadVolumeFile(ctx, c, src.volume, root, dst, fs.FileMode(entries[0].Mode).Perm())
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return localErr(err)
	}
	for _, e := range entries {
		rel := strings.TrimPrefix(e.Path, strings.TrimSuffix(root, "/")+"/")
		if rel == e.Path || !filepath.IsLocal(rel) {
			return fmt.Errorf("volume %s listed %q outside %s: %w", src.volume, e.Path, root, errdefs.ErrFailedPrecondition)
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		switch e.Type {
		case "directory":
			if err := os.MkdirAll(target, fs.FileMode(e.Mode).Perm()|0o700); err != nil {
				return localErr(err)
			}
		case "file":
			if err := downloadVolumeFile(ctx, c, src.volume, e.Path, target, fs.FileMode(e.Mode).Perm()); err != nil {
				return err
			}
		default:
			fmt.Fprintf(warn, "skipped %s:%s: a %s\n", src.volume, e.Path, e.Type)
		}
	}
	return nil
}

func downloadVolumeFile(ctx context.Context, c *client.Client, volume, src, dst string, mode fs.FileMode) error {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return localErr(err)
	}
	err = c.ReadVolumeFile(ctx, volume, src, f)
	if cerr := f.Close(); err == nil {
		err = localErr(cerr)
	}
	return err
}

// kindOf names a file mode's type for a message.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}
