package core

import (
	"context"
	"time"
)

// TemplateBuild is one build requested through E2B's template API, kept
// so its status and log outlive the daemon that ran it.
type TemplateBuild struct {
	ID string
	// Template is the E2B name the build was requested for.
	Template string
	// Target is the Berth template the build writes.
	Target string
	Tags   []string
	// Status is waiting, building, ready or error.
	Status string
	// Reason says why a build ended in error; ReasonStep names the step
	// ("base", or the step's number) when one failed.
	Reason     string
	ReasonStep string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry struct {
	Time    time.Time
	Level   string
	Message string
	Step    string
}

// TemplateBuildStore persists template builds and their logs; the SQLite
// store implements it. GetTemplateBuild of an unknown ID returns an error
// wrapping errdefs.ErrNotFound.
type TemplateBuildStore interface {
	PutTemplateBuild(ctx context.Context, b TemplateBuild) error
	GetTemplateBuild(ctx context.Context, id string) (TemplateBuild, error)
	// AppendBuildLog stores entries as the build's lines from, from+1, …
	// (a line number already stored is left as it is).
	AppendBuildLog(ctx context.Context, id string, from int, entries []BuildLogEntry) error
	// BuildLog returns the build's lines from line from on, in order.
	BuildLog(ctx context.Context, id string, from int) ([]BuildLogEntry, error)
	// BuildLogTail returns the build's last n lines, in order.
	BuildLogTail(ctx context.Context, id string, n int) ([]BuildLogEntry, error)
	// InterruptBuilds ends every build in status building as error with
	// reason (the daemon that ran them is gone) and returns how many.
	InterruptBuilds(ctx context.Context, reason string, at time.Time) (int, error)
	// PruneBuilds removes template's builds but the newest keep, with
	// their logs; a build in status building is never removed.
	PruneBuilds(ctx context.Context, template string, keep int) error
}
