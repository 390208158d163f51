package e2bcompat

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/volume"
)

// E2B's volumes: the SDK's Volume.create, getInfo, list and destroy on the
// control plane, its volume content API (/volumecontent/{volumeID}/…: list,
// makeDir, getInfo, updateMetadata, readFile, writeFile, remove) authorized
// by the volume's own token, and volumeMounts on a sandbox create. They are
// Berth's volumes (the Manager's volumes.go): capped at the daemon's
// volume_bytes, the key's own. The SDK sends content requests to
// E2B_VOLUME_API_URL (set it to the daemon's E2B API, like E2B_API_URL).

// Volumes is what E2B's volume API needs.
type Volumes interface {
	CreateVolume(ctx context.Context, owner, name string, size, maxBytes int64) (core.Volume, error)
	LookupVolume(ctx context.Context, owner, ref string) (core.Volume, error)
	ListVolumes(ctx context.Context) ([]core.Volume, error)
	DeleteVolume(ctx context.Context, id string) error
	// VolumeFiles opens volume id's files (mounting it on the host) until
	// done is called.
	VolumeFiles(ctx context.Context, id string) (files *volume.Files, done func(), err error)
}

func (s *Server) volumeRoutes() {
	m := s.mux
	m.HandleFunc("POST /volumes", s.auth(s.createVolume))
	m.HandleFunc("GET /volumes", s.auth(s.listVolumes))
	m.HandleFunc("GET /volumes/{volumeID}", s.auth(s.getVolume))
	m.HandleFunc("DELETE /volumes/{volumeID}", s.auth(s.deleteVolume))
	m.HandleFunc("GET /volumecontent/{volumeID}/dir", s.volumeFiles(s.listDir))
	m.HandleFunc("POST /volumecontent/{volumeID}/dir", s.volumeFiles(s.makeDir))
	m.HandleFunc("GET /volumecontent/{volumeID}/path", s.volumeFiles(s.statPath))
	m.HandleFunc("PATCH /volumecontent/{volumeID}/path", s.volumeFiles(s.patchPath))
	m.HandleFunc("DELETE /volumecontent/{volumeID}/path", s.volumeFiles(s.removePath))
	m.HandleFunc("GET /volumecontent/{volumeID}/file", s.volumeFiles(s.readVolumeFile))
	m.HandleFunc("PUT /volumecontent/{volumeID}/file", s.volumeFiles(s.writeVolumeFile))
}

// volumeBody is E2B's VolumeAndToken (create, getInfo) and Volume (list,
// without the token).
type volumeBody struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

// visibleVolume is volume {volumeID} if the caller's key sees it: another
// key's is not found.
func (s *Server) visibleVolume(r *http.Request) (core.Volume, error) {
	ref := r.PathValue("volumeID")
	p := callerOf(r)
	v, err := s.cfg.Volumes.LookupVolume(r.Context(), p.Owner(), ref)
	if err == nil && !p.Sees(v.Owner) {
		err = fmt.Errorf("volume %q: %w", ref, errdefs.ErrNotFound)
	}
	return v, err
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string `json:"name"`
	}
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	v, err := s.cfg.Volumes.CreateVolume(r.Context(), keyOf(r).ID, in.Name, 0, keyOf(r).Quota.MaxVolumeBytes)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeBody{VolumeID: v.ID, Name: v.Name, Token: v.Token})
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	all, err := s.cfg.Volumes.ListVolumes(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	p := callerOf(r)
	out := []volumeBody{}
	for _, v := range all {
		if p.Sees(v.Owner) {
			out = append(out, volumeBody{VolumeID: v.ID, Name: v.Name})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.visibleVolume(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeBody{VolumeID: v.ID, Name: v.Name, Token: v.Token})
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.visibleVolume(r)
	if err == nil {
		err = s.cfg.Volumes.DeleteVolume(r.Context(), v.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeFiles authorizes a content request, with the volume's token (what
// the SDK sends) or an API key that sees the volume, and opens its files
// for next.
func (s *Server) volumeFiles(next func(http.ResponseWriter, *http.Request, *volume.Files)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("volumeID")
		v, err := s.cfg.Volumes.LookupVolume(r.Context(), "", id)
		if err != nil || v.ID != id {
			writeError(w, http.StatusNotFound, fmt.Sprintf("volume %q not found", id))
			return
		}
		bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if v.Token == "" || subtle.ConstantTimeCompare([]byte(bearer), []byte(v.Token)) != 1 {
			p, err := auth.Identify(r, s.cfg.Keys, true)
			if err != nil {
				writeError(w, http.StatusUnauthorized, "volume content requests take the volume's token (Authorization: Bearer) or an API key")
				return
			}
			if !p.Sees(v.Owner) {
				writeError(w, http.StatusNotFound, fmt.Sprintf("volume %q not found", id))
				return
			}
		}
		files, done, err := s.cfg.Volumes.VolumeFiles(r.Context(), v.ID)
		if err != nil {
			writeErr(w, err)
			return
		}
		defer done()
		next(w, r, files)
	}
}

// writeFileErr answers a content error: E2B's SDK reads 404 as "path not
// found" and every other status as a VolumeError with the message.
func writeFileErr(w http.ResponseWriter, err error) {
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		writeError(w, http.StatusInsufficientStorage, err.Error())
		return
	}
	writeErr(w, err)
}

// fileQuery reads the content API's query: path (required), and uid,
// gid, mode (numbers) and force where given.
func fileQuery(r *http.Request) (p string, a volume.Attrs, force bool, err error) {
	q := r.URL.Query()
	p = q.Get("path")
	if p == "" {
		return "", a, false, fmt.Errorf("path is required: %w", errdefs.ErrInvalidArgument)
	}
	num := func(name string) (*uint32, error) {
		v := q.Get(name)
		if v == "" {
			return nil, nil
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want a number: %w", name, v, errdefs.ErrInvalidArgument)
		}
		u := uint32(n)
		return &u, nil
	}
	if a.UID, err = num("uid"); err != nil {
		return
	}
	if a.GID, err = num("gid"); err != nil {
		return
	}
	if a.Mode, err = num("mode"); err != nil {
		return
	}
	switch v := q.Get("force"); v {
	case "", "false":
	case "true":
		force = true
	default:
		err = fmt.Errorf("force %q: want true or false: %w", v, errdefs.ErrInvalidArgument)
	}
	return
}

func (s *Server) listDir(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, _, _, err := fileQuery(r)
	depth := 1
	if v := r.URL.Query().Get("depth"); err == nil && v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 1 {
			err = fmt.Errorf("depth %q: want a number of levels, at least 1: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	var list []volume.Entry
	if err == nil {
		list, err = f.List(p, depth)
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	if list == nil {
		list = []volume.Entry{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) makeDir(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, a, force, err := fileQuery(r)
	var e volume.Entry
	if err == nil {
		e, err = f.MakeDir(p, a, force)
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

func (s *Server) statPath(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, _, _, err := fileQuery(r)
	var e volume.Entry
	if err == nil {
		e, err = f.Stat(p)
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) patchPath(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, _, _, err := fileQuery(r)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	var in struct {
		UID  *uint32 `json:"uid"`
		GID  *uint32 `json:"gid"`
		Mode *uint32 `json:"mode"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "body: want JSON {uid, gid, mode}: "+err.Error())
		return
	}
	e, err := f.SetAttrs(p, volume.Attrs{UID: in.UID, GID: in.GID, Mode: in.Mode})
	if err != nil {
		writeFileErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) removePath(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, _, _, err := fileQuery(r)
	if err == nil {
		err = f.Remove(p)
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, _, _, err := fileQuery(r)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	file, fi, err := f.ReadFile(p)
	if err != nil {
		writeFileErr(w, err)
		return
	}
	defer file.Close()
	volume.Serve(w, file, fi.Size())
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, a, force, err := fileQuery(r)
	var e volume.Entry
	if err == nil {
		e, err = f.WriteFile(p, r.Body, a, force)
	}
	if err != nil {
		writeFileErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e)
}
