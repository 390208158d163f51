package template

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// A template may name a start command, which every new sandbox of it runs
// in the background once its agent answers, and a ready check: the
// sandbox is ready only once the check passes. The Manager asks the
// daemon's Starter to do both; this file holds what the template records.

// ReadyCheck says when a sandbox's start command has made it ready. Exactly
// one of Cmd, Port and File is set.
type ReadyCheck struct {
	// Cmd is a shell command (sh -c); ready when it exits 0.
	Cmd string `json:"cmd,omitempty"`
	// Port is a TCP port; ready when something in the sandbox listens on it.
	Port int `json:"port,omitempty"`
	// File is an absolute path; ready when it exists.
	File string `json:"file,omitempty"`
	// TimeoutSeconds bounds the wait (0: DefaultReadyTimeout). A check
	// that has not passed by then fails the create.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// DefaultReadyTimeout is how long a ready check may take when the
// template names no timeout; MaxReadyTimeout bounds what it may name.
const (
	DefaultReadyTimeout = 60 * time.Second
	MaxReadyTimeout     = time.Hour
)

// Timeout is the check's bound.
func (r ReadyCheck) Timeout() time.Duration {
	if r.TimeoutSeconds <= 0 {
		return DefaultReadyTimeout
	}
	return time.Duration(r.TimeoutSeconds) * time.Second
}

// String names the check as errors and logs show it.
func (r ReadyCheck) String() string {
	switch {
	case r.Cmd != "":
		return "ready command " + strconv.Quote(r.Cmd)
	case r.Port != 0:
		return "ready port " + strconv.Itoa(r.Port)
	case r.File != "":
		return "ready file " + r.File
	}
	return "no ready check"
}

// Validate checks the check; errors name the field (ready.cmd, ...).
func (r ReadyCheck) Validate() error {
	n := 0
	for _, set := range []bool{r.Cmd != "", r.Port != 0, r.File != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("ready: set exactly one of cmd, port and file (got %d): %w", n, errdefs.ErrInvalidArgument)
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("ready.port %d: want 1-65535: %w", r.Port, errdefs.ErrInvalidArgument)
	}
	if r.File != "" && (!strings.HasPrefix(r.File, "/") || strings.ContainsRune(r.File, 0) || len(r.File) > 4096) {
		return fmt.Errorf("ready.file %q: want an absolute path: %w", r.File, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(r.Cmd, 0) || len(r.Cmd) > 64<<10 {
		return fmt.Errorf("ready.cmd: NUL byte or longer than 64 KiB: %w", errdefs.ErrInvalidArgument)
	}
	if r.TimeoutSeconds < 0 || time.Duration(r.TimeoutSeconds)*time.Second > MaxReadyTimeout {
		return fmt.Errorf("ready.timeout_seconds %d: want 0-%d: %w", r.TimeoutSeconds, int(MaxReadyTimeout/time.Second), errdefs.ErrInvalidArgument)
	}
	return nil
}

// StartOptions is what a build is asked about the start command and ready
// check. It is recorded in the manifest, so a rebuild asks the same.
type StartOptions struct {
	// Cmd is a shell command (sh -c) started in each new sandbox.
	Cmd string `json:"cmd,omitempty"`
	// FromImage makes the image's ENTRYPOINT+CMD (or a Dockerfile's) the
	// start command; it cannot be combined with Cmd.
	FromImage bool `json:"from_image,omitempty"`
	// Ready, when set, is the ready check.
	Ready *ReadyCheck `json:"ready,omitempty"`
}

// IsZero reports whether o asks for nothing.
func (o StartOptions) IsZero() bool { return o.Cmd == "" && !o.FromImage && o.Ready == nil }

// Validate checks o; errors name the field.
func (o StartOptions) Validate() error {
	if o.Cmd != "" && o.FromImage {
		return fmt.Errorf("start_cmd and start_from_image: choose one: %w", errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(o.Cmd, 0) || len(o.Cmd) > 64<<10 {
		return fmt.Errorf("start_cmd: NUL byte or longer than 64 KiB: %w", errdefs.ErrInvalidArgument)
	}
	if o.Ready != nil {
		return o.Ready.Validate()
	}
	return nil
}

// apply sets d's start command and ready check from o; imageCmd is the
// image's ENTRYPOINT+CMD.
func (o StartOptions) apply(d *Defaults, imageCmd []string) error {
	switch {
	case o.Cmd != "":
		d.Start = []string{"/bin/sh", "-c", o.Cmd}
	case o.FromImage:
		if len(imageCmd) == 0 {
			return fmt.Errorf("start_from_image: the image has no ENTRYPOINT or CMD: %w", errdefs.ErrInvalidArgument)
		}
		d.Start = slices.Clone(imageCmd)
	}
	if o.Ready != nil {
		r := *o.Ready
		d.Ready = &r
	}
	return nil
}

// ApplyTo sets d's start command and ready check from o, taking d.Command
// (ENTRYPOINT+CMD) when o asks for the image's command.
func (o StartOptions) ApplyTo(d *Defaults) error { return o.apply(d, d.Command) }
