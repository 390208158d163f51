package runc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// AgentLogTail quotes the last three lines of the agent's log, reads no
// more than its last KiB, and follows no link.
func TestAgentLogTail(t *testing.T) {
	r := &Runtime{cfg: Config{StateDir: t.TempDir()}}
	const id = "rtlogtail1"
	if got := r.AgentLogTail(id); got != "" {
		t.Errorf("no log: %q, want empty", got)
	}
	if err := os.MkdirAll(r.diskDir(id), 0o755); err != nil {
		t.Fatal(err)
	}
	log := strings.Repeat("x", 4096) + "\none\ntwo\nthree\nfour\n"
	if err := os.WriteFile(r.AgentLog(id), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := r.AgentLogTail(id); got != "two | three | four" {
		t.Errorf("tail = %q, want the last three lines", got)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(r.AgentLog(id))
	if err := os.Symlink(secret, r.AgentLog(id)); err != nil {
		t.Fatal(err)
	}
	if got := r.AgentLogTail(id); got != "" {
		t.Errorf("tail through a symlink = %q, want empty", got)
	}
	if got := r.AgentLogTail("../../etc"); got != "" {
		t.Errorf("tail of a bad ID = %q, want empty", got)
	}
}
