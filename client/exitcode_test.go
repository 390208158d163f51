package client

import "testing"

func TestExitCode(t *testing.T) {
	tests := []struct {
		code   int32
		exited bool
		status string
		want   int
	}{
		{0, true, "exit status 0", 0},
		{3, true, "exit status 3", 3},
		{-1, false, "signal: killed", 137},
		{-1, false, "signal: terminated", 143},
		{-1, false, "signal: interrupt", 130},
		{-1, false, "signal: hangup", 129},
		{-1, false, "signal: segmentation fault (core dumped)", 139},
		{-1, false, "signal 34", 162},
		{-1, false, "signal: SIGUSR1", 138},
		{-1, false, "", 255},
		{-1, false, "weird", 255},
		{7, false, "", 7},
	}
	for _, tt := range tests {
		if got := ExitCode(tt.code, tt.exited, tt.status); got != tt.want {
			t.Errorf("ExitCode(%d, %v, %q) = %d, want %d", tt.code, tt.exited, tt.status, got, tt.want)
		}
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"TERM", 15, true}, {"SIGKILL", 9, true}, {"int", 2, true}, {"HUP", 1, true},
		{"9", 9, true}, {"", 0, false}, {"NOPE", 0, false}, {"200", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseSignal(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseSignal(%q) = %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
