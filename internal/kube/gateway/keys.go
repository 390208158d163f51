package gateway

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/units"
)

// keysFile is the gateway's API keys file (--api-keys), YAML:
//
//	keys:
//	  - id: keyci01
//	    name: ci
//	    sha256: <hex sha256 of the secret, e2b_…>
//	    admin: false
//	    quota:            # optional, each field too; as a daemon's key quota
//	      max_sandboxes: 10
//	      max_cpu: 4      # cores
//	      max_memory: 8G
//	      max_timeout: 2h
//
// Only hashes are in it: it can be a Kubernetes Secret mounted into every
// gateway replica, which then all accept the same keys.
type keysFile struct {
	Keys []fileKey `yaml:"keys"`
}

type fileKey struct {
	ID     string     `yaml:"id"`
	Name   string     `yaml:"name"`
	SHA256 string     `yaml:"sha256"`
	Admin  bool       `yaml:"admin"`
	Quota  *fileQuota `yaml:"quota"`
}

type fileQuota struct {
	MaxSandboxes int64   `yaml:"max_sandboxes"`
	MaxCPU       float64 `yaml:"max_cpu"`
	MaxMemory    string  `yaml:"max_memory"`
	MaxTimeout   string  `yaml:"max_timeout"`
}

// quota is the key's quota, naming a bad field.
func (fq *fileQuota) quota() (core.Quota, error) {
	var q core.Quota
	if fq == nil {
		return q, nil
	}
	if fq.MaxSandboxes < 0 {
		return q, fmt.Errorf("quota.max_sandboxes %d: want 0 (unbounded) or more", fq.MaxSandboxes)
	}
	q.MaxSandboxes = fq.MaxSandboxes
	if !(fq.MaxCPU >= 0 && fq.MaxCPU <= 1<<20) {
		return q, fmt.Errorf("quota.max_cpu %v: want a number of cores, 0 (unbounded) or more", fq.MaxCPU)
	}
	q.MaxCPUMillis = int64(math.Round(fq.MaxCPU * 1000))
	if fq.MaxMemory != "" {
		n, err := units.ParseSize(fq.MaxMemory)
		if err != nil {
			return q, fmt.Errorf("quota.max_memory %q: want a size such as 8G", fq.MaxMemory)
		}
		q.MaxMemoryBytes = n
	}
	if fq.MaxTimeout != "" {
		d, err := units.ParseDuration(fq.MaxTimeout)
		if err != nil {
			return q, fmt.Errorf("quota.max_timeout %q: want a duration such as 2h", fq.MaxTimeout)
		}
		q.MaxTimeout = d
	}
	return q, nil
}

// Key IDs become a pod label's value (LabelOwner).
var keyID = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Keys are the gateway's API keys, read from its keys file.
type Keys struct {
	byHash map[string]core.APIKey
	byID   map[string]core.APIKey
}

// keyPrefix starts every Berth API key (e2bcompat.KeyPrefix: E2B's SDKs
// check keys against ^e2b_[0-9a-f]+$).
const keyPrefix = "e2b_"

// LoadKeys reads an API keys file.
func LoadKeys(path string) (*Keys, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	var f keysFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("api keys %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	ks := &Keys{byHash: map[string]core.APIKey{}, byID: map[string]core.APIKey{}}
	ids := map[string]bool{}
	for i, k := range f.Keys {
		h, err := hex.DecodeString(k.SHA256)
		switch {
		case !keyID.MatchString(k.ID):
			return nil, fmt.Errorf("api keys %s: key %d: id %q: want a DNS label (it becomes a pod label's value): %w", path, i, k.ID, errdefs.ErrInvalidArgument)
		case ids[k.ID]:
			return nil, fmt.Errorf("api keys %s: id %q twice: %w", path, k.ID, errdefs.ErrInvalidArgument)
		case err != nil || len(h) != 32:
			return nil, fmt.Errorf("api keys %s: key %s: sha256 %q: want 64 hex digits: %w", path, k.ID, k.SHA256, errdefs.ErrInvalidArgument)
		}
		q, err := k.Quota.quota()
		if err != nil {
			return nil, fmt.Errorf("api keys %s: key %s: %v: %w", path, k.ID, err, errdefs.ErrInvalidArgument)
		}
		ids[k.ID] = true
		hash := hex.EncodeToString(h)
		key := core.APIKey{ID: k.ID, Name: k.Name, Hash: hash, Admin: k.Admin, Quota: q}
		ks.byHash[hash] = key
		ks.byID[k.ID] = key
	}
	return ks, nil
}

// Verify returns the key whose secret is secret, or an error wrapping
// errdefs.ErrUnauthenticated, as a daemon's keys verify
// (e2bcompat.Keys.Verify).
func (ks *Keys) Verify(_ context.Context, secret string) (core.APIKey, error) {
	if secret == "" {
		return core.APIKey{}, fmt.Errorf("missing API key: send it as \"Authorization: Bearer KEY\" or in the X-API-Key header: %w", errdefs.ErrUnauthenticated)
	}
	if !strings.HasPrefix(secret, keyPrefix) || len(secret) > 256 {
		return core.APIKey{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	k, ok := ks.byHash[auth.HashKey(secret)]
	if !ok {
		return core.APIKey{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	return k, nil
}

// ByID returns the key whose ID is id, for work done on a key's behalf
// without its secret (an automatic resume, Gateway.asOwner).
func (ks *Keys) ByID(id string) (core.APIKey, bool) {
	k, ok := ks.byID[id]
	return k, ok
}
