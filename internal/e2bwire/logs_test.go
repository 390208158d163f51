package e2bwire

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

func messages(es []LogEntry) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.Level+" "+e.Message)
	}
	return out
}

// TestSandboxLogs: events and work log records merge oldest first, with
// levels from what happened; level, search, cursor, direction and limit
// select from them.
func TestSandboxLogs(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	events := []types.Event{
		{Time: t0, Type: types.EventCreated},
		{Time: t0.Add(time.Second), Type: types.EventReady},
		{Time: t0.Add(4 * time.Second), Type: types.EventOOM, Message: "out of memory: 1 process killed"},
	}
	work := []types.WorklogEntry{
		{Time: t0.Add(2 * time.Second), Kind: "exec", API: "e2b", Cmd: "/bin/sh", Args: []string{"-c", "make"}, PID: 7, Done: true, Exited: true, ExitCode: 2},
		{Time: t0.Add(3 * time.Second), Kind: "write", Path: "/home/user/a.txt", HTTPStatus: 200},
		{Time: t0.Add(5 * time.Second), Kind: "exec", Cmd: "nope", Error: "not found"},
	}
	all := SandboxLogs(events, work, LogQuery{MinLevel: "debug", Limit: 100})
	want := []string{"info created", "info ready", "warn exec /bin/sh -c make (exit 2)", "info write /home/user/a.txt",
		"warn oom: out of memory: 1 process killed", "error exec nope: not found"}
	if got := messages(all); len(got) != len(want) {
		t.Fatalf("entries = %q", got)
	} else {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("entry %d = %q, want %q", i, got[i], want[i])
			}
		}
	}
	if f := all[2].Fields; f["source"] != "worklog" || f["pid"] != "7" || f["exit_code"] != "2" || f["api"] != "e2b" || all[2].Timestamp != "2027-01-15T08:00:02Z" {
		t.Errorf("exec entry = %+v", all[2])
	}
	for _, tc := range []struct {
		q    LogQuery
		want []string
	}{
		{LogQuery{MinLevel: "warn", Limit: 100}, []string{"warn exec /bin/sh -c make (exit 2)", "warn oom: out of memory: 1 process killed", "error exec nope: not found"}},
		{LogQuery{MinLevel: "debug", Search: "make", Limit: 100}, []string{"warn exec /bin/sh -c make (exit 2)"}},
		{LogQuery{MinLevel: "debug", Cursor: t0.Add(3 * time.Second), Limit: 2}, []string{"info write /home/user/a.txt", "warn oom: out of memory: 1 process killed"}},
		{LogQuery{MinLevel: "debug", Cursor: t0.Add(time.Second), Backward: true, Limit: 100}, []string{"info ready", "info created"}},
		{LogQuery{MinLevel: "debug", Backward: true, Limit: 1}, []string{"error exec nope: not found"}},
		{LogQuery{MinLevel: "debug", Limit: 0}, []string{}},
	} {
		if got := messages(SandboxLogs(events, work, tc.q)); len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) || (len(got) > 1 && got[len(got)-1] != tc.want[len(tc.want)-1]) {
			t.Errorf("%+v = %q, want %q", tc.q, got, tc.want)
		}
	}
	v1 := LogsV1(all[:1])
	if len(v1.Logs) != 1 || v1.Logs[0].Line != "[info] created" || len(v1.LogEntries) != 1 {
		t.Errorf("v1 = %+v", v1)
	}
}

// TestParseLogQuery: v1 reads start and limit, v2 cursor, direction,
// level, limit and search; bad values name their parameter.
func TestParseLogQuery(t *testing.T) {
	q, err := ParseLogQuery(url.Values{"start": {"1800000000000"}, "limit": {"5"}}, false)
	if err != nil || !q.Cursor.Equal(time.Unix(1_800_000_000, 0)) || q.Limit != 5 || q.Backward {
		t.Errorf("v1 = %+v, %v", q, err)
	}
	q, err = ParseLogQuery(url.Values{"cursor": {"1000"}, "direction": {"backward"}, "level": {"warn"}, "search": {"x"}}, true)
	if err != nil || !q.Backward || q.MinLevel != "warn" || q.Search != "x" || q.Limit != DefaultLogLimit || q.Cursor.UnixMilli() != 1000 {
		t.Errorf("v2 = %+v, %v", q, err)
	}
	for _, bad := range []url.Values{{"direction": {"up"}}, {"level": {"trace"}}, {"cursor": {"soon"}}, {"limit": {"-1"}}, {"limit": {"10001"}}} {
		if _, err := ParseLogQuery(bad, true); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v = %v, want invalid_argument", bad, err)
		}
	}
}
