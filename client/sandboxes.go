package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Health asks the daemon whether it is up.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Create makes a sandbox and returns once its agent answers.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	return c.bind(&sb), nil
}

// Get describes one sandbox, with its usage.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return c.bind(&sb), nil
}

// List returns the sandboxes matching opts.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Sandbox, error) {
	q := url.Values{}
	// Sorted so requests are reproducible (and testable).
	keys := make([]string, 0, len(opts.Labels))
	for k := range opts.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		q.Add("label", k+"="+opts.Labels[k])
	}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	var out types.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	sbs := make([]*Sandbox, len(out.Sandboxes))
	for i := range out.Sandboxes {
		sbs[i] = c.bind(&Sandbox{Sandbox: out.Sandboxes[i]})
	}
	return sbs, nil
}

// Kill destroys a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// Remove deletes an ended (stopped or failed) sandbox's record, events and
// logs now, rather than when the daemon's retention runs out. A live
// sandbox is refused (failed_precondition): kill it first.
func (c *Client) Remove(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id)+"/record", nil, nil, nil)
}

// SetTimeout moves a sandbox's deadline to d from now.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if d <= 0 {
		return nil, fmt.Errorf("timeout %v: must be positive: %w", d, errdefs.ErrInvalidArgument)
	}
	body := types.SetTimeoutRequest{Timeout: d.String()}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/timeout", nil, body, &sb); err != nil {
		return nil, err
	}
	return c.bind(&sb), nil
}

// Events returns a sandbox's events so far.
func (c *Client) Events(ctx context.Context, id string) ([]Event, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out types.EventList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id)+"/events", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Events, nil
}

// FollowEvents calls fn for each event of a sandbox, past and future, until
// the sandbox is destroyed (nil), ctx ends, or fn returns an error (which
// FollowEvents returns).
func (c *Client) FollowEvents(ctx context.Context, id string, fn func(Event) error) error {
	if err := checkID(id); err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodGet, sandboxPath(id)+"/events", url.Values{"follow": {"true"}}, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readNDJSON(resp.Body, func(line []byte) error {
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return fmt.Errorf("decode event: %w", err)
		}
		return fn(ev)
	})
}

// Templates lists the templates the daemon knows.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out types.TemplateList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/templates", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// SetTemplateIsolation sets the isolation level sandboxes of the named
// (built) template get when their request names none; "" clears it.
func (c *Client) SetTemplateIsolation(ctx context.Context, name, isolation string) (*Template, error) {
	if name == "" {
		return nil, fmt.Errorf("template name is empty: %w", errdefs.ErrInvalidArgument)
	}
	var out Template
	if err := c.doJSON(ctx, http.MethodPut, "/v1/templates/"+url.PathEscape(name)+"/isolation", nil, types.TemplateIsolationRequest{Isolation: isolation}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTemplateWarm sets how many ready sandboxes the named template's warm
// pool keeps (0 drops it); a create of the template then claims one. The
// pool fills in the background: Ready in the answer counts what it holds
// now, Templates reports it later.
func (c *Client) SetTemplateWarm(ctx context.Context, name string, target int) (*WarmPool, error) {
	return c.setTemplateWarm(ctx, name, types.WarmRequest{Target: &target})
}

// SetTemplateWarmSudo is SetTemplateWarm for the template's pool of
// sudo-capable sandboxes, which creates with AllowSudo claim from (and
// only they).
func (c *Client) SetTemplateWarmSudo(ctx context.Context, name string, target int) (*WarmPool, error) {
	return c.setTemplateWarm(ctx, name, types.WarmRequest{Target: &target, AllowSudo: true})
}

func (c *Client) setTemplateWarm(ctx context.Context, name string, in types.WarmRequest) (*WarmPool, error) {
	if name == "" {
		return nil, fmt.Errorf("template name is empty: %w", errdefs.ErrInvalidArgument)
	}
	var out WarmPool
	if err := c.doJSON(ctx, http.MethodPut, "/v1/templates/"+url.PathEscape(name)+"/warm", nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// BuildTemplate builds (or rebuilds) the named template, copying the build
// log to logWriter (which may be nil) as it arrives. A template made from
// an image is pulled again from the reference it was made from.
func (c *Client) BuildTemplate(ctx context.Context, name string, logWriter io.Writer) (*Template, error) {
	if name == "" {
		return nil, fmt.Errorf("template name is empty: %w", errdefs.ErrInvalidArgument)
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/templates/"+url.PathEscape(name)+"/build", nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	tmpl, err := readBuild(resp.Body, logWriter)
	if err != nil {
		return nil, fmt.Errorf("build template %s: %w", name, err)
	}
	return tmpl, nil
}

// CreateTemplate makes (or remakes) template name from an OCI/Docker image
// reference, copying the pull's progress to logWriter (which may be nil).
func (c *Client) CreateTemplate(ctx context.Context, name, image string, logWriter io.Writer) (*Template, error) {
	return c.CreateTemplateFrom(ctx, TemplateCreateRequest{Name: name, Image: image}, logWriter)
}

// CreateTemplateFrom makes (or remakes) a template as req says (an image,
// a start command, a ready check), copying the build's progress to
// logWriter (which may be nil).
func (c *Client) CreateTemplateFrom(ctx context.Context, req TemplateCreateRequest, logWriter io.Writer) (*Template, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/templates", nil, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	tmpl, err := readBuild(resp.Body, logWriter)
	if err != nil {
		return nil, fmt.Errorf("build template %s from %s: %w", req.Name, req.Image, err)
	}
	return tmpl, nil
}

// RemoveTemplate removes a template that is not built in; the daemon
// refuses while a sandbox uses it.
func (c *Client) RemoveTemplate(ctx context.Context, name string) error {
	if name == "" {
		return fmt.Errorf("template name is empty: %w", errdefs.ErrInvalidArgument)
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// PruneTemplates removes stored layers no template uses.
func (c *Client) PruneTemplates(ctx context.Context) (*TemplatePruneResult, error) {
	var out TemplatePruneResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/templates/prune", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// readBuild reads a build stream: log lines to logWriter, then the
// template or the error that ended the build.
func readBuild(r io.Reader, logWriter io.Writer) (*Template, error) {
	var tmpl *Template
	err := readNDJSON(r, func(line []byte) error {
		var bl types.BuildLine
		if err := json.Unmarshal(line, &bl); err != nil {
			return fmt.Errorf("decode build line: %w", err)
		}
		switch {
		case bl.Error != nil:
			return wireError(bl.Error)
		case bl.Template != nil:
			tmpl = bl.Template
		case bl.Log != nil && logWriter != nil:
			s := *bl.Log
			if len(s) == 0 || s[len(s)-1] != '\n' {
				s += "\n"
			}
			if _, err := io.WriteString(logWriter, s); err != nil {
				return fmt.Errorf("write build log: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if tmpl == nil {
		return nil, fmt.Errorf("stream ended without a result: %w", errdefs.ErrUnavailable)
	}
	return tmpl, nil
}

// maxLine bounds one NDJSON line; build logs can be long, events are short.
const maxLine = 4 << 20

// readNDJSON calls fn with each non-empty line of r.
func readNDJSON(r io.Reader, fn func([]byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		if err := fn(line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read stream: %w", err)
	}
	return nil
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

// checkID refuses an ID the daemon would, before any request: the same
// grammar, the same error body.
func checkID(id string) error {
	if err := types.ValidSandboxID(id); err != nil {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error(), Field: "id"}
	}
	return nil
}

// bind makes sb a data-plane handle of c.
func (c *Client) bind(sb *Sandbox) *Sandbox {
	sb.c = c
	sb.user = c.user
	return sb
}

// Sandbox returns a data-plane handle for the sandbox id without asking the
// daemon anything; only its ID field is set.
func (c *Client) Sandbox(id string) *Sandbox {
	return c.bind(&Sandbox{Sandbox: types.Sandbox{ID: id}})
}

// As returns a copy of the handle whose data-plane calls run as user.
func (s *Sandbox) As(user string) *Sandbox {
	cp := *s
	cp.user = user
	return &cp
}

// Kill destroys the sandbox.
func (s *Sandbox) Kill(ctx context.Context) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	return c.Kill(ctx, s.ID)
}

// SetTimeout moves the sandbox's deadline to d from now and refreshes s.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	sb, err := c.SetTimeout(ctx, s.ID, d)
	if err != nil {
		return err
	}
	s.Deadline = sb.Deadline
	return nil
}

func (s *Sandbox) client() (*Client, error) {
	if s == nil || s.c == nil {
		return nil, fmt.Errorf("sandbox handle not made by a client (use Client.Sandbox): %w", errdefs.ErrFailedPrecondition)
	}
	if err := checkID(s.ID); err != nil {
		return nil, err
	}
	return s.c, nil
}

// Pause pauses a sandbox: it stops using CPU and gives its memory back,
// keeping what its runtime can (the returned Sandbox's Pause says which:
// "memory" or "filesystem"). Pausing a paused sandbox changes nothing.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/pause", nil, nil, &sb); err != nil {
		return nil, err
	}
	return c.bind(&sb), nil
}

// Resume brings a paused sandbox back and returns once its agent answers.
// A positive timeout sets its deadline from now; zero gives it the time it
// had left when paused. Resuming a running sandbox changes nothing.
func (c *Client) Resume(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if timeout < 0 {
		return nil, fmt.Errorf("timeout %v: must not be negative: %w", timeout, errdefs.ErrInvalidArgument)
	}
	var body types.ResumeRequest
	if timeout > 0 {
		body.Timeout = timeout.String()
	}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/resume", nil, body, &sb); err != nil {
		return nil, err
	}
	return c.bind(&sb), nil
}
