package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/units"
	"github.com/berth-sandbox/berth/internal/volume"
)

// Volumes is what the API needs for volumes (the Manager's volumes.go).
type Volumes interface {
	CreateVolume(ctx context.Context, owner, name string, size, maxBytes int64) (core.Volume, error)
	LookupVolume(ctx context.Context, owner, ref string) (core.Volume, error)
	ListVolumes(ctx context.Context) ([]core.Volume, error)
	VolumeUsers(ctx context.Context, id string) ([]string, error)
	VolumeUsed(ctx context.Context, id string) (int64, error)
	DeleteVolume(ctx context.Context, id string) error
	// VolumeFiles opens volume id's files (mounting it on the host) until
	// done is called.
	VolumeFiles(ctx context.Context, id string) (files *volume.Files, done func(), err error)
}

func volumeToJSON(v core.Volume) types.Volume {
	return types.Volume{ID: v.ID, Name: v.Name, SizeBytes: v.SizeBytes, CreatedAt: utc(v.CreatedAt)}
}

// volumeFor returns the volume ref names (an ID, or a name of the
// caller's) if the caller may see it; one it may not is not found.
func (s *Server) volumeFor(r *http.Request, ref string) (core.Volume, error) {
	p := principal(r)
	if ref == "" || len(ref) > 128 {
		return core.Volume{}, badField("volume", fmt.Errorf("volume %q: want an ID or a name: %w", ref, errdefs.ErrInvalidArgument))
	}
	v, err := s.cfg.Volumes.LookupVolume(r.Context(), p.Owner(), ref)
	if err == nil && !p.Sees(v.Owner) {
		err = fmt.Errorf("volume %q: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return core.Volume{}, badField("volume", err)
	}
	return v, nil
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var in types.VolumeRequest
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, err)
		return
	}
	var size int64
	if in.Size != "" {
		var err error
		if size, err = units.ParseSize(in.Size); err != nil {
			writeError(w, badField("size", fmt.Errorf("size: %w", err)))
			return
		}
		if size == 0 {
			writeError(w, badField("size", fmt.Errorf("size %q: want a positive size: %w", in.Size, errdefs.ErrInvalidArgument)))
			return
		}
	}
	p := principal(r)
	v, err := s.cfg.Volumes.CreateVolume(r.Context(), p.Owner(), in.Name, size, p.Key.Quota.MaxVolumeBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeToJSON(v))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	all, err := s.cfg.Volumes.ListVolumes(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	p := principal(r)
	out := types.VolumeList{Volumes: make([]types.Volume, 0, len(all))}
	for _, v := range all {
		if p.Sees(v.Owner) {
			out.Volumes = append(out.Volumes, volumeToJSON(v))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.volumeFor(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	users, err := s.cfg.Volumes.VolumeUsers(r.Context(), v.ID)
	if err != nil {
		writeError(w, err)
		return
	}
	used, err := s.cfg.Volumes.VolumeUsed(r.Context(), v.ID)
	if err != nil {
		writeError(w, err)
		return
	}
	out := volumeToJSON(v)
	out.Sandboxes, out.UsedBytes = users, used
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.volumeFor(r, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.cfg.Volumes.DeleteVolume(r.Context(), v.ID); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeFiles resolves {id} to a volume the caller sees and opens its
// files for next, with the request's path (required).
func (s *Server) volumeFiles(next func(http.ResponseWriter, *http.Request, *volume.Files, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := s.volumeFor(r, r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		p := r.URL.Query().Get("path")
		if p == "" {
			writeError(w, badField("path", fmt.Errorf("path is required: %w", errdefs.ErrInvalidArgument)))
			return
		}
		files, done, err := s.cfg.Volumes.VolumeFiles(r.Context(), v.ID)
		if err != nil {
			writeError(w, err)
			return
		}
		defer done()
		next(w, r, files, p)
	}
}

// pathErr names the path field on a file error that is about the request.
func pathErr(err error) error {
	if errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrNotFound) {
		return badField("path", err)
	}
	return err
}

func (s *Server) listVolume(w http.ResponseWriter, r *http.Request, f *volume.Files, p string) {
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, badField("depth", fmt.Errorf("depth %q: want a number of levels, at least 1: %w", v, errdefs.ErrInvalidArgument)))
			return
		}
		depth = n
	}
	list, err := f.List(p, depth)
	if err != nil {
		writeError(w, pathErr(err))
		return
	}
	if list == nil {
		list = []types.VolumeEntry{}
	}
	writeJSON(w, http.StatusOK, types.VolumeListing{Entries: list})
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request, f *volume.Files, p string) {
	file, fi, err := f.ReadFile(p)
	if err != nil {
		writeError(w, pathErr(err))
		return
	}
	defer file.Close()
	w.Header().Set("X-Berth-Mode", strconv.FormatUint(uint64(fi.Mode().Perm()), 8))
	volume.Serve(w, file, fi.Size())
}

// modeParam reads the optional octal mode query parameter.
func modeParam(r *http.Request) (*uint32, error) {
	v := r.URL.Query().Get("mode")
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o7777 {
		return nil, badField("mode", fmt.Errorf("mode %q: want octal permissions such as 0644: %w", v, errdefs.ErrInvalidArgument))
	}
	m := uint32(n)
	return &m, nil
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request, f *volume.Files, p string) {
	mode, err := modeParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	e, err := f.WriteFile(p, r.Body, volume.Attrs{Mode: mode}, true)
	if err != nil {
		writeError(w, pathErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

func (s *Server) makeVolumeDir(w http.ResponseWriter, r *http.Request, f *volume.Files, p string) {
	mode, err := modeParam(r)
	if err != nil {
		writeError(w, err)
		return
	}
	e, err := f.MakeDir(p, volume.Attrs{Mode: mode}, true)
	if err != nil {
		writeError(w, pathErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

func (s *Server) removeVolumePath(w http.ResponseWriter, r *http.Request, f *volume.Files, p string) {
	if err := f.Remove(p); err != nil {
		writeError(w, pathErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
