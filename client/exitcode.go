package client

import (
	"strconv"
	"strings"
)

// linuxSignals maps the names Go's os.ProcessState.String gives signals on
// Linux ("signal: killed") to their numbers. The agent runs inside a Linux
// sandbox whatever the client's OS, so the table is fixed rather than taken
// from the client's syscall package.
var linuxSignals = map[string]int{
	"hangup":                   1,
	"interrupt":                2,
	"quit":                     3,
	"illegal instruction":      4,
	"trace/breakpoint trap":    5,
	"aborted":                  6,
	"bus error":                7,
	"floating point exception": 8,
	"killed":                   9,
	"user defined signal 1":    10,
	"segmentation fault":       11,
	"user defined signal 2":    12,
	"broken pipe":              13,
	"alarm clock":              14,
	"terminated":               15,
	"stack fault":              16,
	"child exited":             17,
	"continued":                18,
	"stopped (signal)":         19,
	"stopped":                  20,
	"stopped (tty input)":      21,
	"stopped (tty output)":     22,
	"urgent I/O condition":     23,
	"CPU time limit exceeded":  24,
	"file size limit exceeded": 25,
	"virtual timer expired":    26,
	"profiling timer expired":  27,
	"window changed":           28,
	"I/O possible":             29,
	"power failure":            30,
	"bad system call":          31,
}

// SignalFromStatus returns the number of the signal that ended a process,
// parsed from the end event's status string, which is Go's
// os.ProcessState.String(): "signal: killed", "signal: segmentation fault
// (core dumped)", or "signal 34" for signals Go has no name for. It returns
// 0 when status does not describe a signal.
func SignalFromStatus(status string) int {
	status = strings.TrimSpace(status)
	status = strings.TrimSuffix(status, " (core dumped)")
	if rest, ok := strings.CutPrefix(status, "signal: "); ok {
		if n, ok := linuxSignals[rest]; ok {
			return n
		}
		// Some agents print the number or the SIG name instead.
		return signalNumber(rest)
	}
	if rest, ok := strings.CutPrefix(status, "signal "); ok {
		return signalNumber(rest)
	}
	return 0
}

func signalNumber(s string) int {
	if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 && n < 128 {
		return n
	}
	if n, ok := sigNames[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "SIG")]; ok {
		return n
	}
	return 0
}

// sigNames are the short names the CLI accepts and some agents report.
var sigNames = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "USR1": 10,
	"SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
	"CONT": 18, "STOP": 19, "TSTP": 20, "WINCH": 28,
}

// ParseSignal turns "TERM", "SIGTERM", "term" or "15" into a signal number.
func ParseSignal(s string) (int, bool) {
	n := signalNumber(s)
	return n, n != 0
}

// ExitCode turns a process end event into a shell-style exit code: the
// process's own code when it exited, 128+n when signal n ended it (what a
// shell reports), and 255 when the agent says neither (the process could
// not be waited for).
func ExitCode(exitCode int32, exited bool, status string) int {
	if n := SignalFromStatus(status); n != 0 {
		return 128 + n
	}
	if exited || exitCode >= 0 {
		return int(exitCode)
	}
	return 255
}
