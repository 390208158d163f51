package harness

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Handle serves h for requests whose Host is host on the test net's HTTP
// servers (port 80 of every server address), and makes host resolve to
// tn.IP. Hosts added here are not in the HTTPS certificate, so they are
// for plain HTTP.
func (tn *TestNet) Handle(host string, h http.Handler) {
	host = strings.ToLower(host)
	tn.mu.Lock()
	defer tn.mu.Unlock()
	if tn.hosts == nil {
		tn.hosts = map[string]http.Handler{}
	}
	tn.hosts[host] = h
	tn.Zone[host] = tn.IP.String()
}

// route sends a request to the handler registered for its Host, or to
// the echo handler.
func (tn *TestNet) route(w http.ResponseWriter, r *http.Request) {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	tn.mu.Lock()
	h := tn.hosts[host]
	tn.mu.Unlock()
	if h == nil {
		echoHandler(w, r)
		return
	}
	h.ServeHTTP(w, r)
}

// GitServer serves bare repositories over git's dumb HTTP protocol from
// the test net: static files of a directory on the host, which `git
// update-server-info` has made fetchable without a git process.
type GitServer struct {
	Host string
	dir  string
}

// StartGitServer serves repositories at http://host/NAME.git from a
// temporary directory of the test's.
func (tn *TestNet) StartGitServer(t TB, host string) *GitServer {
	t.Helper()
	g := &GitServer{Host: host, dir: t.TempDir()}
	tn.Handle(host, http.FileServer(http.Dir(g.dir)))
	return g
}

// Publish makes the repository at src (a work tree or bare repository on
// the host) fetchable as http://HOST/NAME.git with all its branches and
// tags, replacing what was published under that name, and returns the
// URL.
func (g *GitServer) Publish(t TB, name, src string) string {
	t.Helper()
	dst := filepath.Join(g.dir, name+".git")
	if err := os.RemoveAll(dst); err != nil {
		t.Fatalf("publish %s: %v", name, err)
	}
	hostGit(t, "", "clone", "--quiet", "--bare", "--no-hardlinks", src, dst)
	// Dumb HTTP clients find refs and packs through the files this writes.
	hostGit(t, dst, "update-server-info")
	return "http://" + g.Host + "/" + name + ".git"
}

// hostGit runs git on the host, unaffected by the operator's config.
func hostGit(t TB, dir string, args ...string) string {
	t.Helper()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out.String())
	}
	return strings.TrimSpace(out.String())
}

// ServeFiles makes host a stand-in package registry: GET of a path in
// files returns its content, anything else is 404.
func (tn *TestNet) ServeFiles(host string, files map[string][]byte) {
	tn.Handle(host, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := files[r.URL.Path]
		if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(body)
	}))
}
