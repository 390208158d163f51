package agent

import (
	"compress/gzip"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/proto/envd"
)

// Signature returns the /files signature E2B SDKs compute (see
// envd.FileSignature).
func Signature(path, operation, username, token string, expiration int64) string {
	return envd.FileSignature(path, operation, username, token, expiration)
}

// authorizeFiles accepts the access token header, or a valid and unexpired
// signature in the query.
func (s *Server) authorizeFiles(r *http.Request, operation string) error {
	token := s.token()
	if token == "" {
		return nil
	}
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if s.tokenOK(h) {
			return nil
		}
		return errors.New("access token present in header but does not match")
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errors.New("missing access token or signature")
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errors.New("invalid signature_expiration")
		}
		exp = n
	}
	want := Signature(q.Get("path"), operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errors.New("invalid signature")
	}
	if exp != 0 && exp < time.Now().Unix() {
		return errors.New("signature is already expired")
	}
	return nil
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	if err := s.authorizeFiles(r, "read"); err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	q := r.URL.Query()
	u, err := s.userFor(q.Get("username"), "")
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	path, err := resolvePath(q.Get("path"), u.Home)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
	// writer forever (and a device could block too); what was opened is
	// checked before a byte is read.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		jsonError(w, httpStatus(err), fmt.Errorf("open %q: %w", path, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		jsonError(w, http.StatusInternalServerError, err)
		return
	}
	if fi.IsDir() {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("path %q is a directory", path))
		return
	}
	if !fi.Mode().IsRegular() {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("path %q is a %s, not a regular file: refusing to read it", path, fileKind(fi.Mode())))
		return
	}
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Add("Vary", "Accept-Encoding")
		gz := gzip.NewWriter(w)
		if _, err := io.Copy(gz, f); err != nil {
			s.log.Warn("file_download_failed", "path", path, "err", err)
			return
		}
		_ = gz.Close()
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip (and
// does not refuse it with q=0).
func acceptsGzip(h string) bool {
	for _, part := range strings.Split(h, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		if _, qv, ok := strings.Cut(strings.ReplaceAll(params, " ", ""), "q="); ok {
			if q, err := strconv.ParseFloat(qv, 64); err == nil && q == 0 {
				return false
			}
		}
		return true
	}
	return false
}

type uploadEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
	// Metadata is the file's user.e2b.* attributes as written.
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (s *Server) postFile(w http.ResponseWriter, r *http.Request) {
	w = closeOnError{w}
	if err := s.authorizeFiles(r, "write"); err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	q := r.URL.Query()
	u, err := s.userFor(q.Get("username"), "")
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	md, err := metadataFromHeaders(r.Header)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("decompress request body: %w", err))
			return
		}
		defer gz.Close()
		body = gz
	}
	media, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploadEntry
	switch {
	case media == "application/octet-stream":
		if !q.Has("path") {
			jsonError(w, http.StatusBadRequest, errors.New("path query parameter is required for raw body upload"))
			return
		}
		path, err := resolvePath(q.Get("path"), u.Home)
		if err != nil {
			jsonError(w, http.StatusBadRequest, err)
			return
		}
		written, status, err := writeFile(path, body, u, md)
		if err != nil {
			jsonError(w, status, err)
			return
		}
		out = append(out, uploadEntry{Path: path, Name: filepath.Base(path), Type: "file", Metadata: written})
	case strings.HasPrefix(media, "multipart/"):
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				jsonError(w, http.StatusBadRequest, fmt.Errorf("read multipart form: %w", err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			// With ?path the part lands there; without, its file name (which
			// may carry directories) is taken from the user's home, as envd.
			target := q.Get("path")
			if !q.Has("path") {
				target = partFileName(part)
				if target == "" {
					part.Close()
					jsonError(w, http.StatusBadRequest, errors.New("multipart part has no file name and no path was given"))
					return
				}
			}
			path, err := resolvePath(target, u.Home)
			if err != nil {
				part.Close()
				jsonError(w, http.StatusBadRequest, err)
				return
			}
			for _, e := range out {
				if e.Path == path {
					part.Close()
					jsonError(w, http.StatusBadRequest, fmt.Errorf("cannot upload multiple files to the same path %q in one request", path))
					return
				}
			}
			written, status, err := writeFile(path, part, u, md)
			part.Close()
			if err != nil {
				jsonError(w, status, err)
				return
			}
			out = append(out, uploadEntry{Path: path, Name: filepath.Base(path), Type: "file", Metadata: written})
		}
	default:
		jsonError(w, http.StatusBadRequest, fmt.Errorf("unsupported content type %q, want multipart/form-data or application/octet-stream", r.Header.Get("Content-Type")))
		return
	}
	if out == nil {
		out = []uploadEntry{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// partFileName returns the part's file name keeping its directories
// (multipart.Part.FileName strips them).
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeFile streams r into path (truncating), creating parents; file and new
// parents are owned by u, and md becomes the file's whole metadata set. It
// returns the metadata read back from the file. Memory use is constant:
// io.Copy's buffer.
func writeFile(path string, r io.Reader, u *user, md map[string]string) (map[string]string, int, error) {
	if err := ensureDirs(filepath.Dir(path), u); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return nil, http.StatusInsufficientStorage, err
		}
		return nil, httpStatus(err), err
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, http.StatusBadRequest, fmt.Errorf("path %q is a directory", path)
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, http.StatusBadRequest, fmt.Errorf("path %q is a %s, not a regular file: refusing to write it", path, fileKind(fi.Mode()))
	}
	// O_NONBLOCK: a FIFO swapped in after the check must not block the
	// open (it fails with ENXIO without a reader, or is refused below).
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NONBLOCK, 0o644)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return nil, http.StatusInsufficientStorage, fmt.Errorf("not enough inodes available: %w", err)
		}
		if errors.Is(err, unix.ENXIO) {
			return nil, http.StatusBadRequest, fmt.Errorf("path %q is not a regular file: refusing to write it: %w", path, err)
		}
		return nil, httpStatus(err), fmt.Errorf("open %q: %w", path, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, http.StatusInternalServerError, err
		}
		return nil, http.StatusBadRequest, fmt.Errorf("path %q is a %s, not a regular file: refusing to write it", path, fileKind(fi.Mode()))
	}
	if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
		f.Close()
		return nil, http.StatusInternalServerError, fmt.Errorf("chown %q: %w", path, err)
	}
	_, err = io.Copy(f, r)
	var written map[string]string
	if err == nil {
		if err = setMetadata(f, md); err != nil {
			err = fmt.Errorf("metadata: %w", err)
		} else {
			written = fileMetadata(f)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return nil, http.StatusInsufficientStorage, fmt.Errorf("write %q: not enough disk space available: %w", path, err)
		}
		return nil, http.StatusInternalServerError, fmt.Errorf("write %q: %w", path, err)
	}
	return written, http.StatusOK, nil
}

// closeOnError ends the connection after an error answer to an upload: the
// rest of the request body was never read, so the connection cannot carry
// another request, and a client (or the daemon's proxy) that reused it
// would see its next request fail.
type closeOnError struct{ http.ResponseWriter }

func (c closeOnError) WriteHeader(code int) {
	if code >= 400 {
		c.Header().Set("Connection", "close")
	}
	c.ResponseWriter.WriteHeader(code)
}

// fileKind names a non-regular file's type for error messages.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	case m.IsDir():
		return "directory"
	}
	return "special file"
}
