package template

import (
	"errors"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestSetIsolation: a built template's isolation is recorded in its
// manifest, read back by Get and List, kept across a rebuild and cleared
// by ""; an unbuilt or unknown template is refused.
func TestSetIsolation(t *testing.T) {
	requireRoot(t)
	requireBusybox(t)
	ctx := t.Context()
	s := newTestStore(t, t.TempDir(), testUIDBase)
	if _, err := s.SetIsolation(ctx, "minimal", "gvisor"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("SetIsolation(unbuilt) = %v, want failed precondition", err)
	}
	if _, err := s.SetIsolation(ctx, "nosuch", "gvisor"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetIsolation(nosuch) = %v, want not found", err)
	}
	if _, err := s.Build(ctx, "minimal", nil); err != nil {
		t.Fatal(err)
	}
	if tpl, err := s.SetIsolation(ctx, "minimal", "gvisor"); err != nil || tpl.Isolation != "gvisor" {
		t.Fatalf("SetIsolation(minimal, gvisor) = %+v, %v", tpl, err)
	}
	if tpl, err := s.Get(ctx, "minimal"); err != nil || tpl.Isolation != "gvisor" {
		t.Errorf("Get(minimal) = %+v, %v, want isolation gvisor", tpl, err)
	}
	if tpl, err := s.Build(ctx, "minimal", nil); err != nil || tpl.Isolation != "gvisor" {
		t.Errorf("rebuild = %+v, %v, want isolation gvisor kept", tpl, err)
	}
	if tpl, err := s.SetIsolation(ctx, "minimal", ""); err != nil || tpl.Isolation != "" {
		t.Errorf("SetIsolation(minimal, \"\") = %+v, %v, want cleared", tpl, err)
	}
}
