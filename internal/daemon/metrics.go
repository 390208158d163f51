package daemon

import (
	"context"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/e2bcompat"
	"github.com/berth-sandbox/berth/internal/metrics"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/usage"
	"github.com/berth-sandbox/berth/internal/worklog"
)

// instrumented is the Manager as both APIs see it: creates are timed.
type instrumented struct {
	*sandbox.Manager
	m *metrics.Metrics
}

func (i instrumented) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	start := time.Now()
	sb, err := i.Manager.Create(ctx, req)
	i.m.ObserveCreate(time.Since(start), err)
	return sb, err
}

// metricSources reads sandbox states from the Manager and per-key CPU from
// the usage meter.
func metricSources(mgr *sandbox.Manager, meter *usage.Meter, keys *e2bcompat.Keys) metrics.Sources {
	return metrics.Sources{
		States: func(ctx context.Context) (map[string]int, error) {
			sbs, err := mgr.List(ctx, sandbox.ListOptions{})
			if err != nil {
				return nil, err
			}
			n := map[string]int{}
			for _, sb := range sbs {
				n[sb.State]++
			}
			return n, nil
		},
		KeyCPU: func(ctx context.Context) (map[string]float64, error) {
			us, err := meter.List(ctx, time.Time{})
			if err != nil {
				return nil, err
			}
			ks, err := keys.List(ctx)
			if err != nil {
				return nil, err
			}
			names := map[string]string{}
			for _, k := range ks {
				names[k.ID] = k.Name
			}
			out := map[string]float64{}
			for _, t := range usage.ByOwner(us) {
				out[names[t.Owner]] += t.CPU.Seconds()
			}
			return out, nil
		},
	}
}

// historyRetainInterval is how often the usage history forgets sandboxes
// that ended without a final sample.
const historyRetainInterval = time.Minute

// retainHistory keeps history's series to the live sandboxes until ctx
// ends. A sandbox normally leaves with its final sample; this catches one
// whose cgroup was gone before that sample could be read.
func retainHistory(ctx context.Context, mgr *sandbox.Manager, history *usage.History) {
	t := time.NewTicker(historyRetainInterval)
	defer t.Stop()
	live := []string{string(sandbox.StateCreating), string(sandbox.StateReady), string(sandbox.StatePausing),
		string(sandbox.StatePaused), string(sandbox.StateResuming), string(sandbox.StateStopping)}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		listed := time.Now()
		sbs, err := mgr.List(ctx, sandbox.ListOptions{States: live})
		if err != nil {
			continue
		}
		ids := make(map[string]bool, len(sbs))
		for _, sb := range sbs {
			ids[sb.ID] = true
		}
		history.Retain(ids, listed)
	}
}

// hostRecords reads what the host recorded of a sandbox, its lifecycle
// events and its work log, for E2B's sandbox logs.
func hostRecords(mgr *sandbox.Manager, wl *worklog.Log) func(ctx context.Context, id string) ([]types.Event, []types.WorklogEntry, error) {
	return func(ctx context.Context, id string) ([]types.Event, []types.WorklogEntry, error) {
		evs, err := mgr.Events(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		events := make([]types.Event, 0, len(evs))
		for _, e := range evs {
			events = append(events, types.Event{Time: e.Time, SandboxID: e.SandboxID, Type: e.Type, Message: e.Message})
		}
		es, err := wl.Read(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		work := make([]types.WorklogEntry, 0, len(es))
		for _, e := range es {
			work = append(work, types.WorklogEntry(e))
		}
		return events, work, nil
	}
}
