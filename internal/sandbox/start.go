package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/template"
)

// startBudget is the time a create allows for its template's start
// command and ready check, on top of its other steps.
func startBudget(d template.Defaults) time.Duration {
	if d.Ready != nil {
		return d.Ready.Timeout() + 10*time.Second
	}
	if len(d.Start) > 0 {
		return 10 * time.Second
	}
	return 0
}

// startTemplate runs the template's start command, if it has one, and
// waits for its ready check: a sandbox is ready only once it passed.
func (m *Manager) startTemplate(ctx context.Context, c *creation) error {
	d := c.tpl.Defaults
	if len(d.Start) == 0 && d.Ready == nil {
		return nil
	}
	if m.deps.Starter == nil {
		return fmt.Errorf("template %q has a start command or ready check, which this daemon cannot run: %w", c.tpl.Name, errdefs.ErrFailedPrecondition)
	}
	if err := m.deps.Starter.Start(ctx, agentAddr(c.e.att), c.e.rec.Token, d); err != nil {
		return fmt.Errorf("template %s: %w", c.tpl.Name, err)
	}
	if d.Ready != nil {
		c.log.Info("sandbox_ready_check_passed", "check", d.Ready.String(), "elapsed_ms", time.Since(c.start).Milliseconds())
	}
	return nil
}
