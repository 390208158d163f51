// Package agent is the in-sandbox server, berth-agent. It runs as PID 1 in
// every sandbox and speaks E2B envd's wire protocol on port 49983: Connect
// services process.Process and filesystem.Filesystem, and plain HTTP /health,
// /metrics, /envs and /files. It owns the sandbox's process table and reaps
// its zombies. It imports nothing host-side: it lives inside untrusted
// sandboxes.
package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/proto/envd"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config holds everything the agent needs; main fills it from flags.
type Config struct {
	// Listen is the address Serve's caller should listen on (default
	// 0.0.0.0:49983); Serve itself takes a listener.
	Listen string
	// Token, when set, is required in X-Access-Token (or as a /files
	// signature) on every request but /health.
	Token string
	// DefaultUser acts when a request names no user (default "root").
	DefaultUser string
	// DefaultCwd is where processes start when a request names no cwd
	// (an image template's WORKDIR); default: the user's home.
	DefaultCwd string
	// PasswdPath and GroupPath locate the account databases (default
	// /etc/passwd and /etc/group).
	PasswdPath, GroupPath string
	// Env is the sandbox-wide environment every process gets ("K=V"); nil
	// means the agent's own environment minus agent-internal variables.
	Env []string
	// Reaper, when set, collects every child's status (PID 1 mode). Without
	// it each started process is waited for by pid.
	Reaper *Reaper
	// DiskPath is the filesystem /metrics reports on (default "/").
	DiskPath string
	// KeepaliveInterval is the default interval of keepalive events on
	// streams when the client sends no Keepalive-Ping-Interval (default 50s).
	KeepaliveInterval time.Duration
	// PTYSignals makes the agent turn a PTY's ^C, ^\ and ^Z into signals
	// itself, for kernels whose line discipline does not (gVisor's sentry
	// before 2023; ptysig.go).
	PTYSignals bool
	// Pids, when set, holds the processes the agent starts to its limit
	// (pids.go); the Server owns it from New on.
	Pids   *PidsCgroup
	Logger *slog.Logger
	// Version is reported by nothing on the wire today but kept for logs;
	// default envd.Version.
	Version string
}

// Server is the agent.
type Server struct {
	cfg Config
	log *slog.Logger
	// id is what /init may change after start (a warm sandbox is
	// handed its owner's token, environment and user when claimed).
	id      identity
	procs   *procTable
	watches *watcherSet
	// pidsKiller runs with Config.Pids.
	pidsKiller *pidsKiller
	cpu        cpuSampler
	handler    http.Handler
	// conns is what the servers hold open (quiesce.go).
	conns *connTracker

	mu     sync.Mutex
	srvs   []*http.Server
	closed bool
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = fmt.Sprintf("0.0.0.0:%d", envd.Port)
	}
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "root"
	}
	if cfg.PasswdPath == "" {
		cfg.PasswdPath = "/etc/passwd"
	}
	if cfg.GroupPath == "" {
		cfg.GroupPath = "/etc/group"
	}
	if cfg.DiskPath == "" {
		cfg.DiskPath = "/"
	}
	if cfg.KeepaliveInterval <= 0 {
		cfg.KeepaliveInterval = 50 * time.Second
	}
	if cfg.Version == "" {
		cfg.Version = envd.Version
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	env := cfg.Env
	if env == nil {
		env = SandboxEnv(os.Environ())
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		id:      identity{token: cfg.Token, env: env, user: cfg.DefaultUser},
		procs:   &procTable{spawner: spawner{reaper: cfg.Reaper}, logger: cfg.Logger, ptySignals: cfg.PTYSignals, pids: cfg.Pids, byPID: map[int]*proc{}},
		watches: newWatcherSet(),
		conns:   newConnTracker(),
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, connect.WithCompressMinBytes(compressMinBytes)))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&fsService{s: s}, connect.WithCompressMinBytes(compressMinBytes)))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET /envs", s.envs)
	mux.HandleFunc("GET /files", s.getFile)
	mux.HandleFunc("POST /files", s.postFile)
	mux.HandleFunc("POST /init", s.postInit)
	mux.HandleFunc("POST /quiesce", s.postQuiesce)
	s.handler = s.authorize(mux)
	if cfg.Pids != nil && cfg.Pids.kills {
		s.pidsKiller = startPidsKiller(cfg.Pids, s.procs)
	}
	return s, nil
}

// compressMinBytes: messages shorter than this are sent uncompressed
// whatever compression the client accepts (Connect's default compresses
// every message). A process's start and end events, keepalives and a line
// of output gain nothing from gzip, whose setup per message cost about
// 0.1 ms of an exec's round trip (1.61 against 1.47 ms through the
// daemon, measured side by side).
const compressMinBytes = 1024

// SandboxEnv filters an environment down to what processes should inherit:
// agent-internal variables (BERTH_AGENT_*) and per-user ones (HOME, USER, …,
// which the agent sets per process) are dropped.
func SandboxEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "BERTH_AGENT_"):
		case k == "HOME", k == "USER", k == "LOGNAME", k == "PWD", k == "OLDPWD", k == "SHLVL", k == "_":
		default:
			out = append(out, kv)
		}
	}
	return out
}

// Handler returns the agent's HTTP handler (auth included).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers on l, over HTTP/1.1 and h2c, until ctx ends or Close.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           s.handler,
		Protocols:         protos,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ConnState:         s.conns.hook,
		ConnContext:       func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("agent server closed")
	}
	s.srvs = append(s.srvs, srv)
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving, kills every process the agent started and stops
// watchers.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	srvs := s.srvs
	s.mu.Unlock()
	for _, srv := range srvs {
		_ = srv.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.procs.killAll(ctx)
	s.watches.closeAll()
	if s.pidsKiller != nil {
		s.pidsKiller.close()
	}
	if s.cfg.Pids != nil {
		s.cfg.Pids.Close()
	}
}

// authorize requires the access token on everything but /health; /files also
// accepts a signature (checked in its handlers).
func (s *Server) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.token() == "" || r.URL.Path == "/health" || r.URL.Path == "/files" {
			next.ServeHTTP(w, r)
			return
		}
		if s.tokenOK(r.Header.Get("X-Access-Token")) {
			next.ServeHTTP(w, r)
			return
		}
		err := errors.New("unauthorized access, please provide a valid access token")
		if strings.HasPrefix(r.URL.Path, "/"+processconnect.ProcessName+"/") ||
			strings.HasPrefix(r.URL.Path, "/"+filesystemconnect.FilesystemName+"/") {
			_ = connectErrorWriter.Write(w, r, connectUnauthenticated(err))
			return
		}
		jsonError(w, http.StatusUnauthorized, err)
	})
}

func (s *Server) tokenOK(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.token())) == 1
}

// userFor resolves the user a request acts as: named explicitly (query
// parameter), or in Basic auth, or the default user.
func (s *Server) userFor(explicit, authorization string) (*user, error) {
	name := explicit
	if name == "" {
		n, err := usernameFromBasic(authorization)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", err, errInvalid)
		}
		name = n
	}
	if name == "" {
		name = s.defaultUser()
	}
	return lookupUser(s.cfg.PasswdPath, s.cfg.GroupPath, name)
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}
