package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A sandbox decides how often it is audited: every connection, query and
// refusal is its doing. So that it cannot flood the log (rotating its own
// evidence away) nor make the daemon spend without bound on writing it,
// each sandbox's records pass two gates before they are written:
//
//   - aggregation: a decision identical to one written less than Window
//     ago (same protocol, name, address, port, method, path, outcome,
//     rule and reason) is not written again; it is counted, and once the
//     window closes one record stands for all the repeats (Count, from
//     Time to Last, bytes summed);
//   - a token bucket (Rate per second, Burst at once): records past it
//     are counted, and a summary record says how many decisions (how many
//     of them denials) were not written one by one, with a sample.
//
// The summaries are written when the window closes or the bucket refills,
// at the next append, read or follow tick, or when the sandbox's log is
// closed.

// maxAggregates bounds the decisions remembered per sandbox for
// aggregation; past it new ones go straight to the rate limit.
const maxAggregates = 512

// gate is one sandbox's aggregation and rate-limit state.
type gate struct {
	aggs      map[string]*aggregate
	tokens    float64
	refilled  time.Time
	swept     time.Time
	skipped   int64 // records over the rate limit not written
	skipDeny  int64 // of which denials
	skipFirst time.Time
	skipLast  time.Time
	sample    string // the first skipped denial (or record), described
}

type aggregate struct {
	since time.Time // when the written record was
	rec   Record    // the repeats' sum so far (Count = repeats)
}

func recordKey(r Record) string {
	var b strings.Builder
	for _, s := range []string{r.Proto, r.Name, r.IP, strconv.Itoa(int(r.Port)), r.Method, r.Path, r.Decision, r.Rule, r.Reason} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	return b.String()
}

func describe(r Record) string {
	s := r.Proto + " " + r.Decision
	if r.Name != "" {
		s += " " + r.Name
	}
	if r.IP != "" {
		s += " " + r.IP
		if r.Port != 0 {
			s += ":" + strconv.Itoa(int(r.Port))
		}
	}
	if r.Rule != "" {
		s += " (" + r.Rule + ")"
	}
	return s
}

// admit decides, under l.mu, what happens to r: written now (true), or
// counted into an aggregate or the skipped summary (false). Summaries
// that became due are written first.
func (l *Log) admit(r Record) bool {
	g := l.gates[r.Sandbox]
	now := r.Time
	if g == nil {
		g = &gate{aggs: map[string]*aggregate{}, tokens: float64(l.cfg.Burst), refilled: now, swept: now}
		l.gates[r.Sandbox] = g
	}
	if now.Sub(g.swept) >= time.Second {
		l.sweep(r.Sandbox, g, now, false)
	}
	k := recordKey(r)
	if a := g.aggs[k]; a != nil {
		if now.Sub(a.since) < l.cfg.Window {
			if a.rec.Count == 0 {
				a.rec.Time = now
			}
			a.rec.Count++
			a.rec.Last = now
			a.rec.BytesOut += r.BytesOut
			a.rec.BytesIn += r.BytesIn
			return false
		}
		l.flushAggregate(r.Sandbox, g, k, a)
	}
	g.tokens = min(float64(l.cfg.Burst), g.tokens+now.Sub(g.refilled).Seconds()*l.cfg.Rate)
	g.refilled = now
	if g.tokens < 1 {
		if g.skipped == 0 {
			g.skipFirst = now
			g.sample = describe(r)
		} else if r.Denied() && g.skipDeny == 0 {
			g.sample = describe(r)
		}
		g.skipped++
		if r.Denied() {
			g.skipDeny++
		}
		g.skipLast = now
		return false
	}
	g.tokens--
	if len(g.aggs) < maxAggregates {
		g.aggs[k] = &aggregate{since: now, rec: Record{Sandbox: r.Sandbox, Proto: r.Proto, Name: r.Name, IP: r.IP, Port: r.Port, Method: r.Method, Path: r.Path, Decision: r.Decision, Rule: r.Rule, Reason: r.Reason}}
	}
	return true
}

// sweep writes the summaries that are due (all of them when final).
func (l *Log) sweep(id string, g *gate, now time.Time, final bool) {
	g.swept = now
	for k, a := range g.aggs {
		if final || now.Sub(a.since) >= l.cfg.Window {
			l.flushAggregate(id, g, k, a)
		}
	}
	if g.skipped > 0 {
		r := Record{
			Time: g.skipFirst, Last: g.skipLast, Sandbox: id, Proto: "audit", Decision: "allow", Rule: "rate-limit", Count: g.skipped,
			Reason: fmt.Sprintf("%d decisions (%d of them denials) over the audit rate limit of %g/s were counted, not written one by one; e.g. %s", g.skipped, g.skipDeny, l.cfg.Rate, g.sample),
		}
		if g.skipDeny > 0 {
			r.Decision = "deny"
		}
		g.skipped, g.skipDeny, g.sample = 0, 0, ""
		l.write(r)
	}
}

func (l *Log) flushAggregate(id string, g *gate, k string, a *aggregate) {
	delete(g.aggs, k)
	if a.rec.Count > 0 {
		l.write(a.rec)
	}
}

// flush writes id's summaries that are due, or all of them (a reader
// wants every decision so far accounted for), under l.mu.
func (l *Log) flush(id string, all bool) {
	if g := l.gates[id]; g != nil {
		l.sweep(id, g, l.now(), all)
	}
}

// forget flushes everything of id and drops its gate (its log closes).
func (l *Log) forget(id string) {
	l.flush(id, true)
	delete(l.gates, id)
}
