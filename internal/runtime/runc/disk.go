package runc

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// mountOverlay stacks layers (lowest first, as runtime.Spec orders them)
// under upper at target. Overlay wants the topmost lower dir first.
func mountOverlay(layers []string, upper, work, target string) error {
	lower := make([]string, len(layers))
	for i, l := range layers {
		if strings.ContainsAny(l, ":,") {
			return fmt.Errorf("layer path %q contains ':' or ','", l)
		}
		lower[len(layers)-1-i] = l
	}
	// index=off and xino=off: the upper dir never moves to another lower
	// stack, so the inode index buys nothing and would tie the upper dir to
	// these exact lower dirs' file handles.
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off",
		strings.Join(lower, ":"), upper, work)
	if len(data) >= os.Getpagesize() {
		return fmt.Errorf("overlay options are %d bytes, over the page size", len(data))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}
