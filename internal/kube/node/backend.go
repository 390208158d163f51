package node

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// Sandboxes is what the node needs of the Berth daemon on its host: the
// sandbox lifecycle and the agent's process and file calls. FromClient
// backs it with the daemon's API (its root-only local socket); unit tests
// back it with a fake.
type Sandboxes interface {
	Health(ctx context.Context) (*client.Health, error)
	// Templates lists the daemon's templates, built or not.
	Templates(ctx context.Context) ([]client.Template, error)
	Create(ctx context.Context, req client.CreateRequest) (*client.Sandbox, error)
	Get(ctx context.Context, id string) (*client.Sandbox, error)
	List(ctx context.Context, labels map[string]string) ([]*client.Sandbox, error)
	Kill(ctx context.Context, id string) error
	// FollowEvents calls fn with the sandbox's events, past and new,
	// until it ends or ctx does.
	FollowEvents(ctx context.Context, id string, fn func(client.Event) error) error
	// Events lists the sandbox's events so far, oldest first.
	Events(ctx context.Context, id string) ([]client.Event, error)
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	// SetNetworkPolicy replaces the sandbox's egress policy; a policy
	// the daemon refuses changes nothing.
	SetNetworkPolicy(ctx context.Context, id string, np client.NetworkPolicy) error
	// Pause pauses the sandbox (the answer's Pause says what it kept);
	// Resume brings it back, its deadline keeping the time it had.
	Pause(ctx context.Context, id string) (*client.Sandbox, error)
	Resume(ctx context.Context, id string) error
	// GetSnapshot reads one of the daemon's snapshots.
	GetSnapshot(ctx context.Context, id string) (*client.Snapshot, error)
	// Start runs a command in the background and returns its pid; Attach
	// waits for it to end and returns its exit code.
	Start(ctx context.Context, id string, req client.ExecRequest) (uint32, error)
	Attach(ctx context.Context, id string, pid uint32) (int, error)
	Processes(ctx context.Context, id string) ([]client.ProcessInfo, error)
	// Signal sends signal sig to process pid (and its group).
	Signal(ctx context.Context, id string, pid uint32, sig int) error
	// PortGet sends a GET of path to the sandbox's port, through the
	// daemon's port proxy, and returns the status code.
	PortGet(ctx context.Context, id string, port int, path string, h http.Header) (int, error)
	// DialPort opens a TCP connection to the sandbox's port through the
	// daemon's port tunnel (ctx bounds the dial only).
	DialPort(ctx context.Context, id string, port int) (io.ReadWriteCloser, error)
	// ForwardUDP serves pc until ctx ends: each peer's datagrams go to
	// the sandbox's UDP port through a UDP tunnel of its own, and the
	// answers back to it (client.Sandbox.ForwardUDP).
	ForwardUDP(ctx context.Context, id string, pc net.PacketConn, port int) error
	// Exec runs a command with its streams attached and returns its exit
	// code; ExecPTY does the same on a terminal.
	Exec(ctx context.Context, id string, req client.ExecRequest) (int, error)
	ExecPTY(ctx context.Context, id string, req client.PTYRequest) (*client.PTY, error)
	// ReadFile reads a file as the sandbox's root (the node's own files,
	// and volume files of any mode).
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
	// WriteFile writes a file as the sandbox's root, making its parents.
	WriteFile(ctx context.Context, id, path string, r io.Reader) error
	MakeDir(ctx context.Context, id, path string) error
	logFiles
}

// logFiles is what following a container's log takes: its size, what
// was added past an offset, and word when its directory changes.
type logFiles interface {
	Stat(ctx context.Context, id, path string) (client.EntryInfo, error)
	// ReadFileRange copies at most n bytes from offset (n <= 0: to the
	// end); past the end it copies nothing.
	ReadFileRange(ctx context.Context, id, path string, offset, n int64, w io.Writer) error
	// WatchDir calls ready once the watch is in place, then fn with each
	// change in the directory, until ctx ends, the sandbox goes away, or
	// fn fails.
	WatchDir(ctx context.Context, id, path string, ready func(), fn func(client.FileEvent) error) error
}

// FromClient backs Sandboxes with a Berth API client.
func FromClient(c *client.Client) Sandboxes { return apiSandboxes{c} }

type apiSandboxes struct{ c *client.Client }

func (a apiSandboxes) Health(ctx context.Context) (*client.Health, error) { return a.c.Health(ctx) }

func (a apiSandboxes) Templates(ctx context.Context) ([]client.Template, error) {
	return a.c.Templates(ctx)
}

func (a apiSandboxes) Create(ctx context.Context, req client.CreateRequest) (*client.Sandbox, error) {
	return a.c.Create(ctx, req)
}

func (a apiSandboxes) Get(ctx context.Context, id string) (*client.Sandbox, error) {
	return a.c.Get(ctx, id)
}

func (a apiSandboxes) List(ctx context.Context, labels map[string]string) ([]*client.Sandbox, error) {
	return a.c.List(ctx, client.ListOptions{Labels: labels})
}

func (a apiSandboxes) Kill(ctx context.Context, id string) error { return a.c.Kill(ctx, id) }

func (a apiSandboxes) FollowEvents(ctx context.Context, id string, fn func(client.Event) error) error {
	return a.c.FollowEvents(ctx, id, fn)
}

func (a apiSandboxes) Events(ctx context.Context, id string) ([]client.Event, error) {
	return a.c.Events(ctx, id)
}

func (a apiSandboxes) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	_, err := a.c.SetTimeout(ctx, id, d)
	return err
}

func (a apiSandboxes) SetNetworkPolicy(ctx context.Context, id string, np client.NetworkPolicy) error {
	_, err := a.c.SetNetworkPolicy(ctx, id, np)
	return err
}

func (a apiSandboxes) Pause(ctx context.Context, id string) (*client.Sandbox, error) {
	return a.c.Pause(ctx, id)
}

func (a apiSandboxes) Resume(ctx context.Context, id string) error {
	_, err := a.c.Resume(ctx, id, 0)
	return err
}

func (a apiSandboxes) GetSnapshot(ctx context.Context, id string) (*client.Snapshot, error) {
	return a.c.GetSnapshot(ctx, id)
}

func (a apiSandboxes) Start(ctx context.Context, id string, req client.ExecRequest) (uint32, error) {
	return a.c.Sandbox(id).Start(ctx, req)
}

func (a apiSandboxes) Attach(ctx context.Context, id string, pid uint32) (int, error) {
	return a.c.Sandbox(id).Attach(ctx, pid, io.Discard, io.Discard)
}

func (a apiSandboxes) Processes(ctx context.Context, id string) ([]client.ProcessInfo, error) {
	return a.c.Sandbox(id).Processes(ctx)
}

func (a apiSandboxes) Signal(ctx context.Context, id string, pid uint32, sig int) error {
	return a.c.Sandbox(id).Signal(ctx, pid, sig)
}

func (a apiSandboxes) DialPort(ctx context.Context, id string, port int) (io.ReadWriteCloser, error) {
	return a.c.Sandbox(id).DialPort(ctx, port)
}

func (a apiSandboxes) ForwardUDP(ctx context.Context, id string, pc net.PacketConn, port int) error {
	return a.c.Sandbox(id).ForwardUDP(ctx, pc, port, 0)
}

func (a apiSandboxes) PortGet(ctx context.Context, id string, port int, path string, h http.Header) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sandbox"+path, nil)
	if err != nil {
		return 0, err
	}
	maps.Copy(req.Header, h)
	resp, err := (&http.Client{Transport: a.c.Sandbox(id).PortTransport(port)}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

func (a apiSandboxes) Exec(ctx context.Context, id string, req client.ExecRequest) (int, error) {
	return a.c.Sandbox(id).Exec(ctx, req)
}

func (a apiSandboxes) ExecPTY(ctx context.Context, id string, req client.PTYRequest) (*client.PTY, error) {
	return a.c.Sandbox(id).StartPTY(ctx, req)
}

func (a apiSandboxes) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	return a.c.Sandbox(id).As("root").ReadFile(ctx, path, w)
}

func (a apiSandboxes) WriteFile(ctx context.Context, id, path string, r io.Reader) error {
	return a.c.Sandbox(id).As("root").WriteFile(ctx, path, r)
}

func (a apiSandboxes) MakeDir(ctx context.Context, id, path string) error {
	_, err := a.c.Sandbox(id).MakeDir(ctx, path)
	return err
}

func (a apiSandboxes) Stat(ctx context.Context, id, path string) (client.EntryInfo, error) {
	return a.c.Sandbox(id).Stat(ctx, path)
}

func (a apiSandboxes) ReadFileRange(ctx context.Context, id, path string, offset, n int64, w io.Writer) error {
	return a.c.Sandbox(id).ReadFileRange(ctx, path, offset, n, w)
}

func (a apiSandboxes) WatchDir(ctx context.Context, id, path string, ready func(), fn func(client.FileEvent) error) error {
	return a.c.Sandbox(id).WatchDirNotify(ctx, path, false, ready, fn)
}
