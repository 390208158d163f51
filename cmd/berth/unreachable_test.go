package main

import (
	"net"
	"strings"
	"testing"
)

// TestUnreachableDaemon: every command that talks to the daemon, control
// plane or data plane, says the same thing when nothing answers.
func TestUnreachableDaemon(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // a port that refuses connections
	for _, args := range [][]string{
		{"ls"},
		{"inspect", "sb1"},
		{"kill", "sb1"},
		{"exec", "sb1", "--", "true"},
		{"attach", "sb1", "1"},
		{"ps", "sb1"},
		{"cp", "sb1:/etc/hostname", t.TempDir() + "/x"},
		{"template", "ls"},
		{"events", "sb1"},
	} {
		code, _, stderr := runBerth(t, url, args...)
		want := "cannot reach the berth daemon at " + url
		if code != 1 || !strings.Contains(stderr, want) || !strings.HasSuffix(stderr, "(unavailable)\n") {
			t.Errorf("berth %q = %d, %q; want 1 and %q … (unavailable)", args, code, stderr, want)
		}
	}
}
