package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// Snapshots through the data plane (the gateway's snapshots.go): POST
// DataPlanePrefix + /v1/sandboxes/{id}/snapshots takes one of a pod's
// sandbox (handleDataPlane's routes), GET and DELETE DataPlanePrefix +
// /v1/snapshots/{id} read and remove one, GET …/{id}/export streams it as
// the daemon's portable archive, and POST …/import takes such an archive
// as a snapshot of this node's. A snapshot carries the labels of
// the sandbox it was taken of, so the node serves those whose LabelNode is
// its own name, never another snapshot of the host's daemon.

// handleSnapshots registers the snapshot routes that are not a sandbox's,
// and the daemon's template and registry login routes; templatesChanged
// is called after a change went through them.
// Before a DELETE the node destroys the sandboxes made from the snapshot
// whose pods are deleted (freeSnapshot).
func handleSnapshots(mux *http.ServeMux, socket, nodeName string, p *Pods, templatesChanged func(), log *slog.Logger) {
	proxy := dataPlane(socket, func(string) bool { return true }, log)
	h := func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := types.ValidSandboxID(id); err != nil {
			writeError(w, err)
			return
		}
		if err := snapshotOfNode(r.Context(), p.sb, nodeName, id); err != nil {
			writeError(w, err)
			return
		}
		if r.Method == http.MethodDelete {
			p.freeSnapshot(r.Context(), id)
		}
		path := "/v1/snapshots/" + id
		if strings.HasSuffix(r.URL.Path, "/export") {
			path += "/export"
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), dataPath{}, path)))
	}
	mux.HandleFunc("GET "+DataPlanePrefix+"/v1/snapshots/{id}", h)
	mux.HandleFunc("DELETE "+DataPlanePrefix+"/v1/snapshots/{id}", h)
	// The snapshot as a portable archive (the daemon's export), streamed.
	mux.HandleFunc("GET "+DataPlanePrefix+"/v1/snapshots/{id}/export", h)
	daemon := daemonProxy(socket, log)
	// The daemon's templates (the gateway's template routes, which it
	// keeps to admin keys): listed, made from an image or a Dockerfile,
	// built, given a default isolation or a warm pool, removed, and their
	// unused layers pruned, exported and imported. Builds stream their log as the daemon writes
	// it; a Dockerfile's context streams to the daemon as it comes.
	// forward sends the request on to the daemon; refresh has the node
	// report its templates again afterwards, whatever came of it.
	forward := func(w http.ResponseWriter, r *http.Request, refresh bool) {
		// The daemon's path is the route's own, its wildcards put in.
		_, path, _ := strings.Cut(r.Pattern, " ")
		path = strings.TrimPrefix(strings.TrimPrefix(path, DataPlanePrefix), E2BPrefix)
		for {
			i := strings.IndexByte(path, '{')
			j := strings.IndexByte(path, '}')
			if i < 0 || j < i {
				break
			}
			k := path[i+1 : j]
			v := r.PathValue(k)
			// One path segment, or the daemon would read another route.
			if v == "" || strings.ContainsAny(v, "/\\") || v == "." || v == ".." {
				writeError(w, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: k, Message: fmt.Sprintf("%s %q is not one path segment", k, v)})
				return
			}
			path = path[:i] + v + path[j+1:]
		}
		_ = http.NewResponseController(w).EnableFullDuplex()
		daemon.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), dataPath{}, path)))
		if refresh {
			templatesChanged()
		}
	}
	// A change through them: the node's annotation says what the daemon
	// has now before the gateway answers it.
	toDaemon := func(w http.ResponseWriter, r *http.Request) { forward(w, r, r.Method != http.MethodGet) }
	mux.HandleFunc("GET "+DataPlanePrefix+"/v1/templates", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/templates", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/templates/{name}/build", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/templates/{name}/dockerfile", toDaemon)
	mux.HandleFunc("PUT "+DataPlanePrefix+"/v1/templates/{name}/isolation", toDaemon)
	mux.HandleFunc("PUT "+DataPlanePrefix+"/v1/templates/{name}/warm", toDaemon)
	mux.HandleFunc("DELETE "+DataPlanePrefix+"/v1/templates/{name}", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/templates/prune", toDaemon)
	// Portable templates: the gateway copies a template to a node that
	// lacks it from one that has it, streaming one's export into the
	// other's import.
	mux.HandleFunc("GET "+DataPlanePrefix+"/v1/templates/{name}/export", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/templates/import", toDaemon)
	// E2B's template builds (the gateway sends each build to one node,
	// then copies what it made to the others): the daemon's own E2B
	// routes, under E2BPrefix. An upload's signature is the daemon's.
	mux.HandleFunc("POST "+DataPlanePrefix+E2BPrefix+"/v3/templates", toDaemon)
	mux.HandleFunc("GET "+DataPlanePrefix+E2BPrefix+"/templates/{templateID}/files/{hash}", toDaemon)
	mux.HandleFunc("PUT "+DataPlanePrefix+E2BPrefix+"/templates/{templateID}/files/{hash}", toDaemon)
	mux.HandleFunc("POST "+DataPlanePrefix+E2BPrefix+"/v2/templates/{templateID}/builds/{buildID}", toDaemon)
	// An E2B build's end is seen by a poll of its status: the node
	// reports its templates again after each.
	mux.HandleFunc("GET "+DataPlanePrefix+E2BPrefix+"/templates/{templateID}/builds/{buildID}/status", func(w http.ResponseWriter, r *http.Request) {
		forward(w, r, true)
	})
	// Its registry logins, which image templates pull with.
	mux.HandleFunc("GET "+DataPlanePrefix+"/v1/registries", toDaemon)
	mux.HandleFunc("PUT "+DataPlanePrefix+"/v1/registries/{host}", toDaemon)
	mux.HandleFunc("DELETE "+DataPlanePrefix+"/v1/registries/{host}", toDaemon)
	// An archive imported as a snapshot of this node's: labelled with
	// its name, whatever the archive or the client says. The client's
	// own labels go on, but none of Berth's (berth.dev/).
	mux.HandleFunc("POST "+DataPlanePrefix+"/v1/snapshots/import", func(w http.ResponseWriter, r *http.Request) {
		r = r.Clone(context.WithValue(r.Context(), dataPath{}, "/v1/snapshots/import"))
		labels := slices.DeleteFunc(r.URL.Query()["label"], InternalLabel)
		q := url.Values{"label": append(labels, LabelNode+"="+nodeName)}
		// The gateway keeps a snapshot's copies under its ID.
		if id := r.URL.Query().Get("id"); id != "" {
			q.Set("id", id)
		}
		r.URL.RawQuery = q.Encode()
		_ = http.NewResponseController(w).EnableFullDuplex()
		daemon.ServeHTTP(w, r)
	})
}

// E2BPrefix is where, under DataPlanePrefix, the node carries its
// daemon's E2B template build routes.
const E2BPrefix = "/e2b"

// snapshotOfNode says whether snapshot id of the node's daemon was taken
// of (or imported to) node: ErrNotFound when it is none of its, or none
// at all.
func snapshotOfNode(ctx context.Context, sb Sandboxes, node, id string) error {
	notOurs := fmt.Errorf("snapshot %s is no snapshot of this node's pods: %w", id, errdefs.ErrNotFound)
	snap, err := sb.GetSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
		return notOurs
	}
	if err != nil {
		return fmt.Errorf("berth daemon: snapshot %s: %w", id, err)
	}
	if snap.Labels[LabelNode] != node {
		return notOurs
	}
	return nil
}

// freeSnapshot destroys the sandboxes made from snapshot id whose pods are
// gone from the API or being deleted, before the snapshot is removed: a
// sandbox deleted through the gateway is gone as far as its caller knows,
// though this node may not have seen its pod's deletion yet (or is still
// destroying it; a second destroy waits for the first). A sandbox whose
// pod lives keeps the snapshot, and the daemon refuses the removal.
func (p *Pods) freeSnapshot(ctx context.Context, id string) {
	p.mu.Lock()
	var users []*podState
	for _, ps := range p.pods {
		if ps.plan.req.Snapshot == id && ps.sandboxID != "" {
			users = append(users, ps)
		}
	}
	p.mu.Unlock()
	for _, ps := range users {
		pod, err := p.kube.CoreV1().Pods(ps.pod.Namespace).Get(ctx, ps.pod.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			continue
		}
		if err == nil && pod.UID == ps.pod.UID && pod.DeletionTimestamp == nil {
			continue
		}
		if err := p.kill(ps.sandboxID); err != nil {
			p.log.Warn("sandbox_destroy_failed", "sandbox_id", ps.sandboxID, "snapshot_id", id, "err", err)
		}
	}
}
