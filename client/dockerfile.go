package client

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
)

// DockerfileBuild is a Dockerfile build (BuildDockerfile).
type DockerfileBuild struct {
	// Dockerfile is the Dockerfile's path on this machine (default
	// ContextDir/Dockerfile).
	Dockerfile string
	// ContextDir is the build context directory (default: the
	// Dockerfile's directory). It is sent to the daemon as a tar; the
	// daemon applies its .dockerignore.
	ContextDir string
	BuildArgs  map[string]string
	NoCache    bool
	// StartCmd overrides CMD/ENTRYPOINT as the start command; Ready is
	// the ready check.
	StartCmd string
	Ready    *ReadyCheck
}

// dockerfileInTar is where a Dockerfile from outside the context goes in
// the tar sent to the daemon.
const dockerfileInTar = ".berth-dockerfile/Dockerfile"

// BuildDockerfile makes (or remakes) template name from a Dockerfile,
// copying the build log to logWriter (which may be nil).
func (c *Client) BuildDockerfile(ctx context.Context, name string, b DockerfileBuild, logWriter io.Writer) (*Template, error) {
	if b.Dockerfile == "" && b.ContextDir == "" {
		return nil, fmt.Errorf("dockerfile: no Dockerfile or context given: %w", errdefs.ErrInvalidArgument)
	}
	if b.ContextDir == "" {
		b.ContextDir = filepath.Dir(b.Dockerfile)
	}
	if b.Dockerfile == "" {
		b.Dockerfile = filepath.Join(b.ContextDir, "Dockerfile")
	}
	ctxAbs, err := filepath.Abs(b.ContextDir)
	if err != nil {
		return nil, err
	}
	dfAbs, err := filepath.Abs(b.Dockerfile)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(ctxAbs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("context %s: not a directory: %w", b.ContextDir, errdefs.ErrInvalidArgument)
	}
	df, err := os.ReadFile(dfAbs)
	if err != nil {
		return nil, fmt.Errorf("dockerfile %s: %v: %w", b.Dockerfile, err, errdefs.ErrInvalidArgument)
	}
	inTar := dockerfileInTar
	if rel, err := filepath.Rel(ctxAbs, dfAbs); err == nil && !strings.HasPrefix(rel, "..") {
		inTar = filepath.ToSlash(rel)
	}
	q := url.Values{"dockerfile": {inTar}}
	for k, v := range b.BuildArgs {
		q.Add("build_arg", k+"="+v)
	}
	if b.NoCache {
		q.Set("no_cache", "true")
	}
	if b.StartCmd != "" {
		q.Set("start_cmd", b.StartCmd)
	}
	if r := b.Ready; r != nil {
		if r.Cmd != "" {
			q.Set("ready_cmd", r.Cmd)
		}
		if r.Port != 0 {
			q.Set("ready_port", strconv.Itoa(r.Port))
		}
		if r.File != "" {
			q.Set("ready_file", r.File)
		}
		if r.TimeoutSeconds != 0 {
			q.Set("ready_timeout_seconds", strconv.Itoa(r.TimeoutSeconds))
		}
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeContext(pw, ctxAbs, inTar, df))
	}()
	defer pr.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint("/v1/templates/"+url.PathEscape(name)+"/dockerfile", q), pr)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, decodeError(resp)
	}
	tmpl, err := readBuild(resp.Body, logWriter)
	if err != nil {
		return nil, fmt.Errorf("build template %s from %s: %w", name, b.Dockerfile, err)
	}
	return tmpl, nil
}

// writeContext writes dir as a tar (regular files, directories and
// symlinks, not followed), then the Dockerfile at inTar if it is not in
// the context.
func writeContext(w io.Writer, dir, inTar string, df []byte) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, io.LimitReader(f, h.Size))
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if inTar == dockerfileInTar {
		if err := tw.WriteHeader(&tar.Header{Name: inTar, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(df))}); err != nil {
			return err
		}
		if _, err := tw.Write(df); err != nil {
			return err
		}
	}
	return tw.Close()
}
