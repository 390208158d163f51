package template

import (
	"context"
	"fmt"

	"github.com/berth-sandbox/berth/errdefs"
)

// SetIsolation records the isolation level sandboxes of template name get
// when their request names none; "" clears it (the daemon's default
// applies). The template must be built: the setting lives in its manifest
// and is carried over to later builds. Which levels exist is the caller's
// business (the store keeps the name).
func (s *Store) SetIsolation(ctx context.Context, name, isolation string) (Template, error) {
	if err := ValidName(name); err != nil {
		return Template{}, err
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	t, err := s.inspect(name)
	if err != nil {
		return Template{}, err
	}
	if !t.Built {
		if _, ok := s.recipes[name]; !ok {
			return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
		}
		return Template{}, fmt.Errorf("template %q is not built; run `berth template build %s` first: %w", name, name, errdefs.ErrFailedPrecondition)
	}
	m, err := readManifest(s.manifestPath(name))
	if err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	m.Isolation = isolation
	if err := writeManifest(s.manifestPath(name), m); err != nil {
		return Template{}, err
	}
	return s.inspect(name)
}
