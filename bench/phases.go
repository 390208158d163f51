package main

import (
	"fmt"
	"strings"
	"time"
)

// Where a create's time goes: the daemon runs with --debug, and its debug
// log has one line per create per layer with each phase's duration:
// create_phases (the Manager: record, provision, agent_ready,
// policy_apply, finish), "sandbox created" (the runc runtime inside
// provision: uid slot, disk, idmapped layers, overlay, user namespace,
// runc create, then start_and_before_start: the agent starting while the
// BeforeStart hook wires the network) and attach_phases (hostnet inside
// before_start: netns, sysctls, address reservation, veth, sandbox side,
// nftables).
var createPhases = []phaseMsg{
	{"create_phases", "manager"},
	{`"sandbox created"`, "runc runtime (inside provision)"},
	{"attach_phases", "hostnet (inside before_start)"},
}

// claimPhases: a warm create's claim_phases line (the Manager: admit,
// limits, agent_init, policy, record).
var claimPhases = []phaseMsg{{"claim_phases", "manager"}}

type phaseMsg struct{ msg, layer string }

// phaseRows turns the debug log lines in logs of the messages msgs into
// rows of per-phase durations, in the order the phases first appear.
func phaseRows(logs string, msgs []phaseMsg) []row {
	var rows []row
	for _, pm := range msgs {
		samples := map[string][]time.Duration{}
		var order []string
		for _, line := range strings.Split(logs, "\n") {
			if !strings.Contains(line, "msg="+pm.msg) {
				continue
			}
			for _, f := range strings.Fields(line) {
				k, v, ok := strings.Cut(f, "=")
				if !ok {
					continue
				}
				d, err := time.ParseDuration(v)
				if err != nil {
					continue
				}
				if _, seen := samples[k]; !seen {
					order = append(order, k)
				}
				samples[k] = append(samples[k], d)
			}
		}
		for _, k := range order {
			rows = append(rows, row{fmt.Sprintf("%s: %s", pm.layer, k), samples[k]})
		}
	}
	return rows
}

// printPhases prints the phase rows as a table of their own.
func printPhases(title string, rows []row) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\n| %s | n | p50 | p99 |\n|---|---|---|---|\n", title)
	for _, r := range rows {
		fmt.Printf("| %s | %d | %s | %s |\n", r.name, len(r.samples), fmtDur(pct(r.samples, 50)), fmtDur(pct(r.samples, 99)))
	}
}
