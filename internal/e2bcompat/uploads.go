package e2bcompat

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/template"
)

// The files of a build's copy steps are uploaded before its trigger, one
// tar per content hash, into <dir>/files. An upload is kept while a build
// may still want it and removed after:
//   - asking for its link (or learning it is present) pins it for the
//     template that asked, until a build of that name ends with no other
//     build of the name waiting for its trigger;
//   - a triggered build holds the uploads it copies until it ends;
//   - an upload nobody holds is removed uploadMaxAge after it was last
//     wanted, pinned or not (SweepUploads): an SDK that asked and never
//     triggered does not keep it forever.

// uploadMaxAge bounds how long an upload nobody builds with is kept.
const uploadMaxAge = uploadLinkTTL

// uploadSweepEvery is how often SweepUploads looks for aged uploads.
const uploadSweepEvery = uploadMaxAge / 4

// upload is what holds one uploaded file.
type upload struct {
	// pins are the names whose builds asked for it and may still use it.
	pins map[string]bool
	// users counts the triggered builds copying it.
	users int
	// wanted is when it was last asked for, uploaded or used.
	wanted time.Time
}

// ref returns hash's upload record, made if new. The caller holds mu.
func (t *templateAPI) ref(hash string) *upload {
	u := t.files[hash]
	if u == nil {
		u = &upload{pins: map[string]bool{}}
		t.files[hash] = u
	}
	return u
}

// want pins hash for name's builds.
func (t *templateAPI) want(hash, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := t.ref(hash)
	u.pins[name] = true
	u.wanted = time.Now()
}

// useUploads holds hashes for a build that copies them.
func (t *templateAPI) useUploads(hashes []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hashes {
		u := t.ref(h)
		u.users++
		u.wanted = time.Now()
	}
}

// releaseUploads ends a build's hold on hashes; once no build of name
// waits for its trigger, name's pins go too, and whatever nobody holds is
// removed.
func (t *templateAPI) releaseUploads(name string, hashes []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hashes {
		if u := t.files[h]; u != nil && u.users > 0 {
			u.users--
		}
	}
	if t.waiting[name] == 0 {
		for _, u := range t.files {
			delete(u.pins, name)
		}
	}
	t.pruneLocked(func(u *upload) bool { return u.users == 0 && len(u.pins) == 0 })
}

// pruneLocked removes the uploads drop picks. The caller holds mu.
func (t *templateAPI) pruneLocked(drop func(*upload) bool) {
	for h, u := range t.files {
		if !drop(u) {
			continue
		}
		if err := os.Remove(t.uploadPath(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.log.Warn("remove_upload", "hash", h, "err", err)
			continue
		}
		delete(t.files, h)
	}
}

// adoptUploads takes over the uploads an earlier daemon left: each is
// aged from when it was written, and half-written ones are removed.
func (t *templateAPI) adoptUploads() {
	dir := filepath.Dir(t.uploadPath(strings.Repeat("0", 64)))
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			t.log.Warn("read_uploads", "err", err)
		}
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), ".upload-"):
			_ = os.Remove(filepath.Join(dir, e.Name()))
		case validHash.MatchString(e.Name()):
			fi, err := e.Info()
			if err != nil {
				continue
			}
			w := fi.ModTime()
			if now := time.Now(); w.After(now) {
				// A clock set back must not keep it forever.
				w = now
			}
			t.ref(e.Name()).wanted = w
		}
	}
}

// SweepUploads removes, until ctx ends, the uploads no build holds that
// were last wanted more than uploadMaxAge ago.
func (s *Server) SweepUploads(ctx context.Context) {
	if s.tpl == nil {
		return
	}
	tk := time.NewTicker(uploadSweepEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		s.tpl.sweepUploads()
	}
}

func (t *templateAPI) sweepUploads() {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := time.Now().Add(-uploadMaxAge)
	t.pruneLocked(func(u *upload) bool { return u.users == 0 && u.wanted.Before(old) })
}

// copyHashes are the distinct uploads a build's copy steps name.
func copyHashes(steps []stepBody) []string {
	var out []string
	for _, st := range steps {
		if st.Type == "COPY" && validHash.MatchString(st.FilesHash) && !slices.Contains(out, st.FilesHash) {
			out = append(out, st.FilesHash)
		}
	}
	return out
}

// removeDir removes a build's context directory.
func removeDir(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

func (t *templateAPI) uploadPath(hash string) string {
	return filepath.Join(t.dir, "files", hash)
}

func (t *templateAPI) sign(name, hash string, expires int64) string {
	m := hmac.New(sha256.New, t.secret)
	fmt.Fprintf(m, "%s\x00%s\x00%d", name, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// uploadLink answers GET /templates/{id}/files/{hash}: present, or a link
// (on this daemon, signed, for an hour) to PUT the files' tar to.
func (t *templateAPI) uploadLink(w http.ResponseWriter, r *http.Request) {
	name, hash := r.PathValue("templateID"), r.PathValue("hash")
	if err := template.ValidName(name); err != nil {
		writeErr(w, fmt.Errorf("templateID: %w", err))
		return
	}
	if !validHash.MatchString(hash) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("hash %q: want 64 lowercase hex digits", hash))
		return
	}
	t.want(hash, name)
	if _, err := os.Stat(t.uploadPath(hash)); err == nil {
		writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	exp := time.Now().Add(uploadLinkTTL).Unix()
	url := fmt.Sprintf("%s://%s/templates/%s/files/%s?expires=%d&signature=%s", scheme, r.Host, name, hash, exp, t.sign(name, hash, exp))
	writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": url})
}

// upload answers the PUT of an upload link: the signature is its only
// authentication. The tar (gzipped or not) is stored under its hash.
func (t *templateAPI) upload(w http.ResponseWriter, r *http.Request) {
	name, hash := r.PathValue("templateID"), r.PathValue("hash")
	exp, err := strconv.ParseInt(r.URL.Query().Get("expires"), 10, 64)
	if err != nil || !validHash.MatchString(hash) ||
		!hmac.Equal([]byte(r.URL.Query().Get("signature")), []byte(t.sign(name, hash, exp))) {
		writeError(w, http.StatusForbidden, "upload link: bad or missing signature (ask GET /templates/{templateID}/files/{hash} for a link)")
		return
	}
	if time.Now().Unix() > exp {
		writeError(w, http.StatusForbidden, "upload link expired: ask for a new one")
		return
	}
	if err := os.MkdirAll(filepath.Dir(t.uploadPath(hash)), 0o700); err != nil {
		writeErr(w, err)
		return
	}
	f, err := os.CreateTemp(filepath.Dir(t.uploadPath(hash)), ".upload-")
	if err != nil {
		writeErr(w, err)
		return
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(r.Body, dockerfile.MaxContext+1))
	if err == nil && n > dockerfile.MaxContext {
		err = fmt.Errorf("upload is larger than %d bytes: %w", int64(dockerfile.MaxContext), errdefs.ErrInvalidArgument)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), t.uploadPath(hash))
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	t.want(hash, name)
	w.WriteHeader(http.StatusOK)
}

// unpack extracts the upload hash into dir/hash, once.
func (t *templateAPI) unpack(dir, hash string) error {
	dst := filepath.Join(dir, hash)
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	f, err := os.Open(t.uploadPath(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the files of hash %s were not uploaded (GET /templates/{templateID}/files/%s gives the link): %w", hash, hash, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	rd, err := maybeGunzip(f)
	if err != nil {
		return fmt.Errorf("upload %s: %v: %w", hash, err, errdefs.ErrInvalidArgument)
	}
	return dockerfile.ExtractContext(rd, dst)
}

// maybeGunzip reads r as gzip when it starts like gzip (the SDK gzips
// uploads unless told not to).
func maybeGunzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}
