package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// Sandboxes made from a memory snapshot.
//
// Where the runtime can (MemoryCopier: gVisor on a current runsc), a
// snapshot holds the sandbox's memory image besides its writable layer
// (core.SnapshotMemory), and a sandbox made from it (a create from the
// snapshot, every copy of a fork) does not boot: it starts from the
// image, so every process its source ran carries on in it, with its
// memory, open files and working directories, on a root filesystem that
// holds the source's files as they were at that instant.
//
// What it does not take over from its source, it gets its own of, as a
// fresh sandbox does:
//
//   - its sandbox ID, hostname, network namespace, veth (so its own MAC)
//     and address: gVisor's restore takes the interfaces of the namespace
//     the new sandbox joins, not those in the image, so the copy's
//     network stack has its own address, routes and empty neighbour
//     tables; connections its source had open are closed;
//   - its agent access token: the restored agent still holds the
//     source's, which the daemon uses once, right after the restore, to
//     hand it the new sandbox's (POST /init), together with the new
//     sandbox's ID in the environment every later process gets;
//   - egress services with their own resolver and policy, written into
//     its files as for a fresh sandbox. The CA is the exception: its
//     processes read the source's CA certificate when they started (Node
//     loads NODE_EXTRA_CA_CERTS once, a Go or Python client its pool) and
//     trust only that one, so the new sandbox's proxy signs with the
//     source's CA. The snapshot keeps the CA's certificate and key beside
//     the memory image (imageCACert, imageCAKey; host-side, the key
//     0600), so a sandbox made from it long after its source is gone, or
//     on another daemon after an export, still gets it. Sharing a CA
//     gives no sandbox anything of another's: the key never enters a
//     sandbox, and what a copy trusts is what its memory already did;
//   - randomness: gVisor's kernel draws getrandom, /dev/random and
//     /dev/urandom from the host's on every read, so no two copies read
//     the same bytes there. What a process already drew and keeps in its
//     own memory (a seeded userspace generator, the Go runtime's, an
//     OpenSSL DRBG, Python's random module) is copied with that memory;
//     processes that need distinct streams per copy must reseed after a
//     fork (docs/api.md says how to tell: BERTH_SANDBOX_ID in a new
//     process's environment, or the hostname, changes in each copy).

// memoryStart is what a create from a memory snapshot starts from.
type memoryStart struct {
	snapshot string
	// image is the checkpoint image's directory.
	image string
	// token is the access token the image's agent holds.
	token string
}

// memoryStartOf checks that req may start from memory snapshot s, which
// fixes what its processes already run with: the isolation level, the
// agent's own pids limit, allow_sudo and the working directory (the
// default user is the agent's to change, as at a warm-pool claim). A request may leave each unset (the snapshot's) or name the
// snapshot's.
func (m *Manager) memoryStartOf(s core.Snapshot, req *CreateRequest) (*memoryStart, error) {
	fixed := func(field, what string) error {
		return &FieldError{Field: field, Err: fmt.Errorf("%s: snapshot %s holds running processes, which keep the %s they were started with; leave it unset: %w", field, s.ID, what, errdefs.ErrInvalidArgument)}
	}
	switch {
	case req.Isolation != "" && req.Isolation != s.Isolation:
		return nil, fixed("isolation", "isolation level ("+s.Isolation+")")
	case req.Limits.PidsLimit != 0 && req.Limits.PidsLimit != s.PidsLimit:
		return nil, fixed("pids_limit", fmt.Sprintf("pids limit (%d)", s.PidsLimit))
	case req.AllowSudo != nil && *req.AllowSudo != s.AllowSudo:
		return nil, fixed("allow_sudo", fmt.Sprintf("allow_sudo (%v)", s.AllowSudo))
	case req.Workdir != "":
		return nil, fixed("workdir", "working directory")
	case s.AgentToken == "":
		return nil, &FieldError{Field: "snapshot", Err: fmt.Errorf("snapshot %s: memory snapshot without its agent's token: %w", s.ID, errdefs.ErrFailedPrecondition)}
	}
	return &memoryStart{snapshot: s.ID, image: m.snapshotMemoryIn(m.snapshotDir(s.ID)), token: s.AgentToken}, nil
}

// checkMemoryStart refuses a start from a memory image on a runtime that
// cannot (an older runsc than the one that took the snapshot, say).
func (m *Manager) checkMemoryStart(req CreateRequest, iso string) error {
	if mc, ok := m.rts[iso].(MemoryCopier); ok && mc.CopiesMemory() {
		return nil
	}
	return &FieldError{Field: "snapshot", Err: fmt.Errorf("snapshot %s holds memory, which this daemon's %s runtime cannot start a sandbox from: %w", req.Snapshot, iso, errdefs.ErrFailedPrecondition)}
}

// reidentify hands the agent of a sandbox started from a memory image
// its own identity in place of the source's: the new token, and the new
// sandbox's ID, the request's environment and its default user for every
// process it starts from now on.
func (m *Manager) reidentify(ctx context.Context, c *creation) error {
	ai, ok := m.deps.Files.(AgentIniter)
	if !ok {
		return fmt.Errorf("agent init: %w", errdefs.ErrNotImplemented)
	}
	e := c.e
	env := map[string]string{"BERTH_SANDBOX_ID": e.rec.ID}
	maps.Copy(env, e.rec.Env)
	if err := ai.Init(ctx, agentAddr(e.att), c.restore.token, env, e.rec.Token, e.rec.User, 0); err != nil {
		return fmt.Errorf("hand the restored agent its identity: %w", err)
	}
	return nil
}

// A memory snapshot's copy of its source's egress CA, in the image's
// directory (so export and import carry it with the image; runsc reads
// only its own files there).
const (
	imageCACert = "berth-egress-ca.pem"
	imageCAKey  = "berth-egress-ca.key"
)

// keepSourceCA saves sandbox id's egress CA into image, the directory of
// the memory image just taken of it. A sandbox without egress state has
// none to keep.
func (m *Manager) keepSourceCA(id, image string) error {
	if m.deps.Egress == nil {
		return nil
	}
	cert, key, err := m.deps.Egress.CA(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("keep the egress CA: %w", err)
	}
	if err := os.WriteFile(filepath.Join(image, imageCAKey), key, 0o600); err != nil {
		return fmt.Errorf("keep the egress CA: %w", err)
	}
	if err := os.WriteFile(filepath.Join(image, imageCACert), cert, 0o644); err != nil {
		return fmt.Errorf("keep the egress CA: %w", err)
	}
	return nil
}

// adoptSourceCA makes the egress CA kept beside image (keepSourceCA)
// sandbox id's, before its egress services are prepared. An image without
// one (taken before Berth kept it) leaves id to make its own, which the
// image's processes do not trust: the log says so.
func (m *Manager) adoptSourceCA(id, image string) error {
	if m.deps.Egress == nil {
		return nil
	}
	cert, cerr := os.ReadFile(filepath.Join(image, imageCACert))
	key, kerr := os.ReadFile(filepath.Join(image, imageCAKey))
	if errors.Is(cerr, os.ErrNotExist) && errors.Is(kerr, os.ErrNotExist) {
		m.log.Warn("memory_image_without_egress_ca", "sandbox_id", id, "image", image,
			"why", "the snapshot predates kept CAs; intercepted TLS fails in processes that loaded the source's CA")
		return nil
	}
	if err := errors.Join(cerr, kerr); err != nil {
		return fmt.Errorf("the memory image's egress CA: %w", err)
	}
	return m.deps.Egress.AdoptCA(id, cert, key)
}
