package harness

import (
	"os"
	"path/filepath"
	"slices"
)

// snapshotLeaks lists the entries of the daemon's snapshots dir
// (<data-dir>/snapshots): once a test has removed its snapshots (and a
// fork's snapshot went with its last copy) there must be none, nor any
// half-written one (.partial) or export scratch file.
func snapshotLeaks(d *Daemon, kept ...string) []string {
	var out []string
	ents, err := os.ReadDir(filepath.Join(d.DataDir, "snapshots"))
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if !slices.Contains(kept, e.Name()) {
			out = append(out, "snapshot "+e.Name())
		}
	}
	return out
}

// AssertSnapshotsClean fails t for any entry of the daemon's snapshots dir
// but the complete snapshots kept.
func AssertSnapshotsClean(t TB, d *Daemon, kept ...string) {
	t.Helper()
	for _, l := range snapshotLeaks(d, kept...) {
		t.Errorf("leak in the snapshots dir: %s", l)
	}
}
