package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strings"
)

// minimalRecipeVersion changes when buildMinimal's output changes.
const minimalRecipeVersion = "minimal/1"

func minimalHash(s *Store) (string, error) {
	f, err := os.Open(s.cfg.BusyboxPath)
	if err != nil {
		return "", fmt.Errorf("busybox: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	h.Write([]byte(minimalRecipeVersion + "\x00"))
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("busybox: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

const (
	minimalPasswd = `root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
`
	minimalGroup = `root:x:0:
user:x:1000:
nogroup:x:65534:
`
	layerHosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
	minimalProfile = `export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
`
)

// buildMinimal lays out a busybox root: the static binary, one symlink per
// applet, accounts for root and user, and the mount points berth needs.
func buildMinimal(ctx context.Context, s *Store, dst string, log io.Writer) error {
	var list bytes.Buffer
	cmd := exec.CommandContext(ctx, s.cfg.BusyboxPath, "--list-full")
	cmd.Stdout = &list
	cmd.Stderr = log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s --list-full: %w", s.cfg.BusyboxPath, err)
	}

	w := layerWriter{root: dst, base: s.cfg.UIDBase}
	dirs := []struct {
		rel  string
		mode uint32
		uid  uint32
	}{
		{"/", 0o755, 0},
		{"bin", 0o755, 0},
		{"sbin", 0o755, 0},
		{"usr/bin", 0o755, 0},
		{"usr/sbin", 0o755, 0},
		{"etc", 0o755, 0},
		{"var/tmp", 0o1777, 0},
		{"tmp", 0o1777, 0},
		{"root", 0o700, 0},
		{"home", 0o755, 0},
		{"home/user", 0o755, 1000},
		{"run", 0o755, 0},
		{"proc", 0o755, 0},
		{"sys", 0o755, 0},
		{"dev", 0o755, 0},
		{".berth", 0o755, 0},
	}
	for _, d := range dirs {
		if err := w.dir(d.rel, d.mode, d.uid, d.uid); err != nil {
			return err
		}
	}
	for _, d := range []string{"usr", "var"} {
		if err := w.dir(d, 0o755, 0, 0); err != nil {
			return err
		}
	}
	if err := w.copyFile(s.cfg.BusyboxPath, "bin/busybox", 0o755, 0, 0); err != nil {
		return err
	}
	n := 0
	for _, applet := range strings.Fields(list.String()) {
		applet = path.Clean("/" + applet)
		if applet == "/bin/busybox" || strings.Contains(applet, "..") {
			continue
		}
		if _, err := os.Lstat(w.path(applet)); err == nil {
			continue
		}
		if err := w.dir(path.Dir(applet), 0o755, 0, 0); err != nil {
			return err
		}
		if err := w.symlink(applet, "/bin/busybox"); err != nil {
			return err
		}
		n++
	}
	files := []struct{ rel, content string }{
		{"etc/passwd", minimalPasswd},
		{"etc/group", minimalGroup},
		{"etc/hosts", layerHosts},
		{"etc/hostname", "berth\n"},
		{"etc/profile", minimalProfile},
	}
	for _, f := range files {
		if err := w.file(f.rel, f.content, 0o644, 0, 0); err != nil {
			return err
		}
	}
	fmt.Fprintf(log, "busybox with %d applets\n", n)
	return nil
}
