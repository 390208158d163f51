package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Registry is a real OCI registry (Debian's docker-registry, the CNCF
// distribution server) on a random loopback port, with its own storage in
// a temp dir. Images are built with umoci and pushed with skopeo, both
// Debian packages (scripts/deps.sh installs all three).
type Registry struct {
	t    TB
	Addr string // 127.0.0.1:port
	dir  string
	// User and Password, when set, are the only account of a registry
	// with htpasswd auth (StartRegistryAuth).
	User, Password string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// RequireImageTools fails the test if docker-registry, umoci or skopeo
// is missing.
func RequireImageTools(t TB) {
	t.Helper()
	for _, tool := range []string{"docker-registry", "umoci", "skopeo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh (Debian packages docker-registry, umoci, skopeo)", tool)
		}
	}
}

// StartRegistry starts a registry on loopback; it stops when the test ends.
func StartRegistry(t TB) *Registry {
	t.Helper()
	RequireImageTools(t)
	r := &Registry{t: t, Addr: freeAddr(t), dir: t.TempDir()}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// StartRegistryAuth starts a registry on loopback that wants user and
// password (htpasswd auth: the bcrypt file made by Debian's htpasswd, from
// apache2-utils). Push uses them.
func StartRegistryAuth(t TB, user, password string) *Registry {
	t.Helper()
	RequireImageTools(t)
	if _, err := exec.LookPath("htpasswd"); err != nil {
		t.Fatalf("htpasswd not found: run scripts/deps.sh (Debian package apache2-utils)")
	}
	r := &Registry{t: t, Addr: freeAddr(t), dir: t.TempDir(), User: user, Password: password}
	out, err := exec.Command("htpasswd", "-Bbn", user, password).Output()
	if err != nil {
		t.Fatalf("htpasswd: %v", err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "htpasswd"), out, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start (re)starts the registry process and waits until it answers /v2/.
func (r *Registry) Start() {
	t := r.t
	t.Helper()
	auth := ""
	if r.User != "" {
		auth = fmt.Sprintf(`auth:
  htpasswd:
    realm: berth-test
    path: %s
`, filepath.Join(r.dir, "htpasswd"))
	}
	cfg := auth + fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(r.dir, "storage"), r.Addr)
	cfgPath := filepath.Join(r.dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	cmd := exec.Command("docker-registry", "serve", cfgPath)
	logf, err := os.Create(filepath.Join(r.dir, "registry.log"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start docker-registry: %v", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	hc := &http.Client{Timeout: 2 * time.Second}
	WaitFor(t, 30*time.Second, "docker-registry to answer on "+r.Addr, func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(r.dir, "registry.log"))
			t.Fatalf("docker-registry exited during start:\n%s", b)
		default:
		}
		resp, err := hc.Get("http://" + r.Addr + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		// With auth, an anonymous /v2/ is refused once the server is up.
		return resp.StatusCode == http.StatusOK || (r.User != "" && resp.StatusCode == http.StatusUnauthorized)
	})
}

// Stop stops the registry (idempotent) and waits for it to exit.
func (r *Registry) Stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// OCILayout is an OCI image layout on disk that umoci builds images in.
type OCILayout struct {
	t   TB
	Dir string
}

// NewOCILayout makes an empty OCI image layout.
func NewOCILayout(t TB) *OCILayout {
	t.Helper()
	RequireImageTools(t)
	l := &OCILayout{t: t, Dir: filepath.Join(t.TempDir(), "oci")}
	l.run("umoci", "init", "--layout", l.Dir)
	return l
}

func (l *OCILayout) run(name string, args ...string) string {
	l.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (l *OCILayout) image(tag string) string { return l.Dir + ":" + tag }

// New starts an image with no layers under tag.
func (l *OCILayout) New(tag string) {
	l.t.Helper()
	l.run("umoci", "new", "--image", l.image(tag))
}

// Copy tags a copy of the image from under tag to.
func (l *OCILayout) Copy(from, to string) {
	l.t.Helper()
	l.run("umoci", "tag", "--image", l.image(from), to)
}

// AddLayer adds one layer holding the tree that fill makes in an empty
// root directory (which it gets as its argument).
func (l *OCILayout) AddLayer(tag string, fill func(root string)) {
	l.t.Helper()
	src := filepath.Join(l.t.TempDir(), "layer")
	if err := os.Mkdir(src, 0o755); err != nil {
		l.t.Fatalf("%v", err)
	}
	fill(src)
	entries, err := os.ReadDir(src)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	if len(entries) == 0 {
		l.t.Fatalf("layer of %s: fill made nothing", tag)
	}
	// umoci insert adds one path per layer; insert the whole root once.
	l.run("umoci", "insert", "--image", l.image(tag), src, "/")
}

// Whiteout adds a layer that deletes path.
func (l *OCILayout) Whiteout(tag, path string) {
	l.t.Helper()
	l.run("umoci", "insert", "--image", l.image(tag), "--whiteout", path)
}

// Opaque adds a layer that replaces directory target with the contents
// of the tree fill makes.
func (l *OCILayout) Opaque(tag, target string, fill func(dir string)) {
	l.t.Helper()
	src := filepath.Join(l.t.TempDir(), "opaque")
	if err := os.Mkdir(src, 0o755); err != nil {
		l.t.Fatalf("%v", err)
	}
	fill(src)
	l.run("umoci", "insert", "--image", l.image(tag), "--opaque", src, target)
}

// Config sets image config options, as umoci config flags
// ("--config.env=A=b", "--config.workingdir=/w", "--architecture=arm64").
func (l *OCILayout) Config(tag string, flags ...string) {
	l.t.Helper()
	l.run("umoci", append([]string{"config", "--image", l.image(tag)}, flags...)...)
}

// Index adds tag as an image index (manifest list) of the images under
// the given tags, each entry labelled with its image's os/architecture.
func (l *OCILayout) Index(tag string, of ...string) {
	l.t.Helper()
	var idx struct {
		SchemaVersion int              `json:"schemaVersion"`
		MediaType     string           `json:"mediaType"`
		Manifests     []map[string]any `json:"manifests"`
	}
	top := l.readIndex()
	for _, m := range top.Manifests {
		ref, _ := m["annotations"].(map[string]any)["org.opencontainers.image.ref.name"].(string)
		for _, want := range of {
			if ref != want {
				continue
			}
			var man struct {
				Config struct{ Digest string } `json:"config"`
			}
			l.readBlob(m["digest"].(string), &man)
			var cfg struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			}
			l.readBlob(man.Config.Digest, &cfg)
			idx.Manifests = append(idx.Manifests, map[string]any{
				"mediaType": m["mediaType"], "digest": m["digest"], "size": m["size"],
				"platform": map[string]string{"os": cfg.OS, "architecture": cfg.Architecture},
			})
		}
	}
	if len(idx.Manifests) != len(of) {
		l.t.Fatalf("index %s: found %d of the images %v", tag, len(idx.Manifests), of)
	}
	idx.SchemaVersion = 2
	idx.MediaType = "application/vnd.oci.image.index.v1+json"
	b, _ := json.Marshal(idx)
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := os.WriteFile(filepath.Join(l.Dir, "blobs", "sha256", hex.EncodeToString(sum[:])), b, 0o644); err != nil {
		l.t.Fatalf("%v", err)
	}
	top.Manifests = append(top.Manifests, map[string]any{
		"mediaType": idx.MediaType, "digest": digest, "size": len(b),
		"annotations": map[string]string{"org.opencontainers.image.ref.name": tag},
	})
	b, _ = json.Marshal(top)
	if err := os.WriteFile(filepath.Join(l.Dir, "index.json"), b, 0o644); err != nil {
		l.t.Fatalf("%v", err)
	}
}

type ociIndex struct {
	SchemaVersion int              `json:"schemaVersion"`
	MediaType     string           `json:"mediaType,omitempty"`
	Manifests     []map[string]any `json:"manifests"`
}

func (l *OCILayout) readIndex() ociIndex {
	var idx ociIndex
	b, err := os.ReadFile(filepath.Join(l.Dir, "index.json"))
	if err == nil {
		err = json.Unmarshal(b, &idx)
	}
	if err != nil {
		l.t.Fatalf("index.json: %v", err)
	}
	return idx
}

func (l *OCILayout) readBlob(digest string, v any) {
	b, err := os.ReadFile(filepath.Join(l.Dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		l.t.Fatalf("blob %s: %v", digest, err)
	}
}

// Push copies the image (or index, with all its images) under tag to the
// registry as repo:rtag, over plain HTTP.
func (l *OCILayout) Push(tag string, r *Registry, repoTag string) {
	l.t.Helper()
	args := []string{"copy", "--all", "--quiet", "--dest-tls-verify=false"}
	if r.User != "" {
		args = append(args, "--dest-creds", r.User+":"+r.Password)
	}
	l.run("skopeo", append(args, "oci:"+l.image(tag), "docker://"+r.Addr+"/"+repoTag)...)
}

// BusyboxRoot returns a fill for OCILayout.AddLayer: a static busybox
// (the host's /bin/busybox, Debian's busybox-static) with every applet
// linked, accounts for root and user (uid 1000) with their homes, /tmp
// and /work (owned by user).
func BusyboxRoot(t TB) func(root string) {
	return func(root string) {
		t.Helper()
		out, err := exec.Command("/bin/busybox", "--list-full").Output()
		if err != nil {
			t.Fatalf("busybox --list-full: %v", err)
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("busybox root: %v", err)
			}
		}
		for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "work", "home/user"} {
			must(os.MkdirAll(filepath.Join(root, d), 0o755))
		}
		must(os.Chmod(filepath.Join(root, "tmp"), 0o1777))
		b, err := os.ReadFile("/bin/busybox")
		must(err)
		must(os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755))
		for _, applet := range strings.Fields(string(out)) {
			p := filepath.Join(root, filepath.Clean("/"+applet))
			if _, err := os.Lstat(p); err == nil {
				continue
			}
			must(os.MkdirAll(filepath.Dir(p), 0o755))
			must(os.Symlink("/bin/busybox", p))
		}
		must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"), 0o644))
		must(os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644))
		must(os.Chown(filepath.Join(root, "home/user"), 1000, 1000))
		must(os.Chown(filepath.Join(root, "work"), 1000, 1000))
	}
}
