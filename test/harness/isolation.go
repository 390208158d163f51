package harness

import (
	"os/exec"
	"testing"

	"github.com/berth-sandbox/berth/client"
)

// Isolations are the levels the e2e and hostile suites run at: runc
// always, gvisor when runsc is installed (scripts/deps.sh installs it;
// without it a gvisor case skips saying so).
func Isolations() []string { return []string{client.IsolationRunc, client.IsolationGVisor} }

// RequireIsolation skips a gvisor case on a host without runsc.
func RequireIsolation(t TB, iso string) {
	t.Helper()
	if iso != client.IsolationGVisor {
		return
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("gvisor level: runsc is not installed (apt-get install runsc; scripts/deps.sh)")
	}
}

// ForEachIsolation runs fn as one subtest per isolation level.
func ForEachIsolation(t *testing.T, fn func(t *testing.T, iso string)) {
	t.Helper()
	for _, iso := range Isolations() {
		t.Run(iso, func(t *testing.T) {
			RequireIsolation(t, iso)
			fn(t, iso)
		})
	}
}
