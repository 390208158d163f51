package e2bwire

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// A sandbox's logs, as E2B's GET /sandboxes/{id}/logs and
// /v2/sandboxes/{id}/logs answer them, are what Berth recorded of it on
// the host, where the sandbox cannot touch it: its lifecycle events
// (created, ready, paused, out of memory, its policy changes, …) and its
// work log (each command run through either API, with its arguments, exit
// code and output sizes, and each file written, moved or removed).

// LogEntry is E2B's SandboxLogEntry.
type LogEntry struct {
	Timestamp string            `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
	at        time.Time
}

// LogLine is E2B's SandboxLog.
type LogLine struct {
	Timestamp string `json:"timestamp"`
	Line      string `json:"line"`
}

// LogsBody is E2B's SandboxLogs (GET /sandboxes/{id}/logs).
type LogsBody struct {
	Logs       []LogLine  `json:"logs"`
	LogEntries []LogEntry `json:"logEntries"`
}

// LogsV2Body is E2B's SandboxLogsV2Response (GET /v2/sandboxes/{id}/logs).
type LogsV2Body struct {
	Logs []LogEntry `json:"logs"`
}

// logLevels are E2B's log levels, lowest first.
var logLevels = []string{"debug", "info", "warn", "error"}

// DefaultLogLimit and MaxLogLimit bound the entries of one answer.
const (
	DefaultLogLimit = 1000
	MaxLogLimit     = 10000
)

// LogQuery is what a logs request asks for: entries from Cursor on (or,
// Backward, up to it, newest first), at MinLevel or above, whose message
// holds Search, at most Limit.
type LogQuery struct {
	Cursor   time.Time
	Backward bool
	MinLevel string
	Search   string
	Limit    int
}

// ParseLogQuery reads a logs request's query: v1's start and limit, or
// v2's cursor, direction, level, limit and search.
func ParseLogQuery(q url.Values, v2 bool) (LogQuery, error) {
	out := LogQuery{MinLevel: "debug", Limit: DefaultLogLimit}
	cursor := "start"
	if v2 {
		cursor = "cursor"
		switch d := q.Get("direction"); d {
		case "", "forward":
		case "backward":
			out.Backward = true
		default:
			return out, fmt.Errorf("direction %q: want forward or backward: %w", d, errdefs.ErrInvalidArgument)
		}
		if l := q.Get("level"); l != "" {
			if !slices.Contains(logLevels, l) {
				return out, fmt.Errorf("level %q: want one of %s: %w", l, strings.Join(logLevels, ", "), errdefs.ErrInvalidArgument)
			}
			out.MinLevel = l
		}
		out.Search = q.Get("search")
	}
	if v := q.Get(cursor); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return out, fmt.Errorf("%s %q: want unix milliseconds: %w", cursor, v, errdefs.ErrInvalidArgument)
		}
		out.Cursor = time.UnixMilli(ms)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxLogLimit {
			return out, fmt.Errorf("limit %q: want 0 to %d: %w", v, MaxLogLimit, errdefs.ErrInvalidArgument)
		}
		out.Limit = n
	}
	return out, nil
}

// SandboxLogs is what Berth recorded of a sandbox as E2B log entries,
// oldest first, then q applied.
func SandboxLogs(events []types.Event, work []types.WorklogEntry, q LogQuery) []LogEntry {
	all := make([]LogEntry, 0, len(events)+len(work))
	for _, ev := range events {
		all = append(all, eventEntry(ev))
	}
	for _, w := range work {
		all = append(all, workEntry(w))
	}
	slices.SortStableFunc(all, func(a, b LogEntry) int { return a.at.Compare(b.at) })
	floor := slices.Index(logLevels, q.MinLevel)
	out := []LogEntry{}
	keep := func(e LogEntry) bool {
		return slices.Index(logLevels, e.Level) >= floor && strings.Contains(e.Message, q.Search)
	}
	if q.Backward {
		for i := len(all) - 1; i >= 0 && len(out) < q.Limit; i-- {
			if e := all[i]; (q.Cursor.IsZero() || !e.at.After(q.Cursor)) && keep(e) {
				out = append(out, e)
			}
		}
		return out
	}
	for _, e := range all {
		if len(out) >= q.Limit {
			break
		}
		if !e.at.Before(q.Cursor) && keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// LogsV1 is entries as v1's answer: the structured entries and each as a
// line.
func LogsV1(entries []LogEntry) LogsBody {
	out := LogsBody{Logs: make([]LogLine, 0, len(entries)), LogEntries: entries}
	for _, e := range entries {
		out.Logs = append(out.Logs, LogLine{Timestamp: e.Timestamp, Line: "[" + e.Level + "] " + e.Message})
	}
	return out
}

func newEntry(at time.Time, level, msg string, fields map[string]string) LogEntry {
	return LogEntry{Timestamp: at.UTC().Format(time.RFC3339Nano), Level: level, Message: msg, Fields: fields, at: at}
}

// eventEntry is a lifecycle event: a failure is an error, an OOM kill a
// warning, the rest information.
func eventEntry(ev types.Event) LogEntry {
	level := "info"
	switch ev.Type {
	case types.EventFailed:
		level = "error"
	case types.EventOOM:
		level = "warn"
	}
	msg := ev.Type
	if ev.Message != "" {
		msg += ": " + ev.Message
	}
	return newEntry(ev.Time, level, msg, map[string]string{"source": "event", "type": ev.Type})
}

// workEntry is a work log record: a command with how it ended (an error
// if it could not run, a warning if it exited non-zero), or a file
// operation.
func workEntry(w types.WorklogEntry) LogEntry {
	fields := map[string]string{"source": "worklog", "kind": w.Kind}
	if w.API != "" {
		fields["api"] = w.API
	}
	if w.User != "" {
		fields["user"] = w.User
	}
	level := "info"
	var msg string
	switch w.Kind {
	case "exec", "attach":
		msg = w.Kind + " " + strings.Join(append([]string{w.Cmd}, w.Args...), " ")
		if w.PID != 0 {
			fields["pid"] = strconv.FormatUint(uint64(w.PID), 10)
		}
		// A process that exited carries its code (and envd's "exit
		// status N" as its error); an error without an exit is a command
		// that could not run or was cut.
		switch {
		case w.Exited:
			fields["exit_code"] = strconv.Itoa(int(w.ExitCode))
			msg += fmt.Sprintf(" (exit %d)", w.ExitCode)
			if w.ExitCode != 0 {
				level = "warn"
			}
		case w.Error != "":
			level, msg = "error", msg+": "+w.Error
		case w.Done:
			msg += " (" + w.Status + ")"
		}
	default:
		msg = w.Kind + " " + w.Path
		if len(w.Paths) > 0 {
			msg = w.Kind + " " + strings.Join(w.Paths, ", ")
		}
		if w.Dest != "" {
			msg += " -> " + w.Dest
		}
		if w.HTTPStatus >= 400 {
			level = "warn"
			fields["http_status"] = strconv.Itoa(w.HTTPStatus)
		}
		if w.Error != "" {
			level, msg = "error", msg+": "+w.Error
		}
	}
	return newEntry(w.Time, level, msg, fields)
}
