// Package e2e runs end-to-end tests against a real berth daemon: the real
// binaries, runc, network namespaces, nftables and SQLite on this host. It
// needs root; it skips (saying why) only when root or runc is missing.
package e2e

import (
	"os"
	"testing"

	"github.com/berth-sandbox/berth/test/harness"
)

var bin harness.Binaries

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, &bin, nil))
}

// StartDaemon starts a daemon for this test.
func StartDaemon(t *testing.T, extra ...string) *harness.Daemon {
	t.Helper()
	return harness.StartDaemon(t, bin, extra...)
}

type Daemon = harness.Daemon

var (
	Run           = harness.Run
	MustRun       = harness.MustRun
	waitFor       = harness.WaitFor
	AssertNoLeaks = harness.AssertNoLeaks
)
