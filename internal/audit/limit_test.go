package audit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// clock is a settable time for the log's gates.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestLog(t *testing.T, cfg Config) (*Log, *clock) {
	t.Helper()
	cfg.Dir = t.TempDir()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l.now = c.now
	return l, c
}

// total is how many decisions the records stand for.
func total(recs []Record) int64 {
	var n int64
	for _, r := range recs {
		n += max(r.Count, 1)
	}
	return n
}

func TestAggregateRepeats(t *testing.T) {
	l, c := newTestLog(t, Config{Window: 10 * time.Second})
	for i := range 1000 {
		c.t = c.t.Add(time.Millisecond)
		l.Append(Record{Time: c.t, Sandbox: "sb", Proto: "tls", Name: "a.test", IP: "192.0.2.1", Port: 443, Decision: "allow", Rule: "a.test", BytesOut: 10, BytesIn: int64(i)})
	}
	c.t = c.t.Add(11 * time.Second)
	recs, err := l.Read("sb", Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Count != 0 || recs[1].Count != 999 {
		t.Fatalf("1000 identical decisions gave %d records: %+v; want the first and one with count 999", len(recs), recs)
	}
	if recs[1].BytesOut != 9990 || recs[1].Last.Before(recs[1].Time) {
		t.Errorf("aggregate = %+v, want bytes_out 9990 and last after time", recs[1])
	}
	if got := total(recs); got != 1000 {
		t.Errorf("records stand for %d decisions, want 1000", got)
	}
}

func TestRateLimitSummarizes(t *testing.T) {
	l, c := newTestLog(t, Config{Rate: 10, Burst: 20})
	const n = 5000
	for i := range n {
		c.t = c.t.Add(100 * time.Microsecond) // 10,000 a second
		l.Append(Record{Time: c.t, Sandbox: "sb", Proto: "dns", Name: fmt.Sprintf("r%d.flood.test", i), Decision: "deny", Rule: "default"})
	}
	c.t = c.t.Add(2 * time.Second)
	l.Close("sb")
	recs, err := l.Read("sb", Filter{})
	if err != nil {
		t.Fatal(err)
	}
	// 0.5 s of flooding: the burst, about 5 refills and a summary a second.
	if len(recs) > 40 {
		t.Errorf("%d records written for a 0.5 s flood at a rate of 10/s, burst 20", len(recs))
	}
	if got := total(recs); got != n {
		t.Errorf("records stand for %d decisions, want %d", got, n)
	}
	var summary *Record
	for i := range recs {
		if recs[i].Rule == "rate-limit" {
			summary = &recs[i]
		}
	}
	if summary == nil || summary.Decision != "deny" || !strings.Contains(summary.Reason, "denials") {
		t.Errorf("no denial summary among %+v", recs)
	}
}

// A denial, then a long flood of allowed traffic: rotation keeps the
// earliest records and every denial.
func TestRotationKeepsEvidence(t *testing.T) {
	l, c := newTestLog(t, Config{MaxBytes: 4 << 10, Keep: 1, HeadBytes: 600, KeptBytes: 64 << 10, Rate: 1e9, Burst: 1e9})
	add := func(name, dec string) {
		c.t = c.t.Add(time.Millisecond)
		l.Append(Record{Time: c.t, Sandbox: "sb", Proto: "tls", Name: name, Decision: dec, Rule: "r"})
	}
	add("first.test", "allow")
	add("secret.evil.test", "deny")
	for i := range 2000 {
		add(fmt.Sprintf("n%d.ok.test", i), "allow")
		if i == 1000 {
			add("middle.evil.test", "deny")
		}
	}
	recs, err := l.Read("sb", Filter{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range recs {
		names[r.Name] = true
	}
	for _, want := range []string{"first.test", "secret.evil.test", "middle.evil.test", "n1999.ok.test"} {
		if !names[want] {
			t.Errorf("%s rotated away (%d records left)", want, len(recs))
		}
	}
	if names["n1500.ok.test"] {
		t.Errorf("n1500.ok.test still there: rotation dropped nothing, so the test tests nothing")
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Time.Before(recs[i-1].Time) {
			t.Fatalf("records out of order at %d: %v then %v", i, recs[i-1].Time, recs[i].Time)
		}
	}
}
