// Package e2bwire is E2B's API as Berth speaks it, apart from any sandbox
// backend: the wire shapes of its control plane, its error bodies, its
// listing filters and cursor, its network settings as Berth egress policy,
// and its preview host grammar. The daemon's E2B API (internal/e2bcompat)
// and the Kubernetes gateway (internal/kube/gateway) both serve E2B with
// them; it links neither a sandbox manager nor Kubernetes.
package e2bwire

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// DefaultDomain is the preview domain when none is configured.
const DefaultDomain = "berth.localhost"

// DefaultUser is the user E2B sandboxes run commands as when a request
// names none, as on E2B (whose templates have a "user" account).
const DefaultUser = "user"

// DefaultTimeout is E2B's default sandbox lifetime when a create names none.
const DefaultTimeout = 15 * time.Second

// ClientID is reported where E2B reports the node a sandbox runs on.
const ClientID = "berth"

// ParseHost splits a preview host "<port>-<id>.<domain>[:listen-port]" into
// the sandbox ID and port. IDs are [a-z0-9] (no dash), so the first dash
// ends the port.
func ParseHost(host, domain string) (id string, port int, ok bool) {
	host = strings.ToLower(host)
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	label, found := strings.CutSuffix(host, "."+domain)
	if !found || domain == "" {
		return "", 0, false
	}
	p, id, found := strings.Cut(label, "-")
	if !found || p == "" || len(p) > 5 || types.ValidSandboxID(id) != nil {
		return "", 0, false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	return id, port, true
}

// ErrorBody is E2B's error shape.
type ErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// WriteError answers status with msg in E2B's error shape.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, ErrorBody{Code: status, Message: msg})
}

// WriteErr maps an error class to its status: the one place E2B's API
// turns errors into wire codes.
func WriteErr(w http.ResponseWriter, err error) {
	status := errdefs.HTTPStatus(err)
	msg := err.Error()
	// The status already says the class; its name would only add noise.
	if class := errdefs.FromCode(errdefs.Code(err)); class != nil {
		msg = strings.TrimSuffix(msg, ": "+class.Error())
	}
	if status == http.StatusInternalServerError {
		msg = "internal error: " + msg
	}
	WriteError(w, status, msg)
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the status is sent; a failed body means the client left
}

// SandboxGone is E2B's answer (and wording) on the data plane for a
// sandbox that does not run; the SDKs' isRunning reads it.
func SandboxGone(w http.ResponseWriter, id string) {
	WriteJSON(w, http.StatusBadGateway, map[string]any{
		"code": http.StatusBadGateway, "message": "The sandbox was not found: " + strconv.Quote(id) + " does not exist or is not running", "sandboxId": id,
	})
}

// Decode reads a JSON body leniently: the SDKs send fields Berth does not
// know (and newer SDKs will send more); the ones Berth cannot honour are
// checked by the caller, by name.
func Decode(r *http.Request, v any) error {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if strings.TrimSpace(string(data)) == "" {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("malformed request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Present reports whether a raw JSON field was sent with a value.
func Present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// CreateBody is E2B's NewSandbox. Fields Berth cannot honour are kept raw
// so that any non-default value is refused by name.
type CreateBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *NetworkConfig    `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	MCP          json.RawMessage `json:"mcp"`
	IAM          json.RawMessage `json:"iam"`
	VolumeMounts []VolumeMount   `json:"volumeMounts"`
}

// VolumeMount is E2B's SandboxVolumeMount: volume Name bound at Path.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Unsupported names the first field of b that asks for something Berth
// does not do.
func (b CreateBody) Unsupported() string {
	switch {
	case Present(b.MCP):
		return "mcp (the MCP gateway) is not supported by Berth"
	case Present(b.IAM):
		return "iam tokens are not supported by Berth"
	}
	return ""
}

// CheckSecure refuses secure: false: Berth always issues and requires an
// access token (E2B's secure: true).
func (b CreateBody) CheckSecure() string {
	if b.Secure != nil && !*b.Secure {
		return "secure: false is not supported: Berth always requires the sandbox's access token on its data plane"
	}
	return ""
}

// SandboxBody is E2B's Sandbox: what create and connect answer.
type SandboxBody struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

// ListedBody is E2B's ListedSandbox.
type ListedBody struct {
	TemplateID   string            `json:"templateID"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    string            `json:"startedAt"`
	EndAt        string            `json:"endAt"`
	CPUCount     int64             `json:"cpuCount"`
	MemoryMB     int64             `json:"memoryMB"`
	DiskSizeMB   int64             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []VolumeMount     `json:"volumeMounts"`
}

// DetailBody is E2B's SandboxDetail.
type DetailBody struct {
	ListedBody
	EnvdAccessToken     string          `json:"envdAccessToken"`
	Domain              string          `json:"domain"`
	AllowInternetAccess bool            `json:"allowInternetAccess"`
	Network             json.RawMessage `json:"network,omitempty"`
	Lifecycle           LifecycleBody   `json:"lifecycle"`
}

// LifecycleBody is E2B's SandboxLifecycle: what happens at the deadline.
type LifecycleBody struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// TimeoutBody is the body of POST /sandboxes/{id}/timeout and of connect.
type TimeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// ListQuery is what both sandbox listings filter and sort by.
type ListQuery struct {
	// Metadata keeps sandboxes whose metadata holds every pair.
	Metadata map[string]string
	// Running and Paused are the states asked for (both by default).
	Running, Paused bool
	// Template keeps only sandboxes of this template ("" = all).
	Template string
	// StartedAfter and StartedBefore bound the start time, both inclusive
	// (zero = unbounded).
	StartedAfter, StartedBefore time.Time
	// Asc sorts oldest first; E2B's default is newest first.
	Asc bool
}

// ParseListQuery reads the filters shared by GET /sandboxes and GET
// /v2/sandboxes.
func ParseListQuery(q url.Values) (ListQuery, error) {
	f := ListQuery{Metadata: map[string]string{}}
	if raw := q.Get("metadata"); raw != "" {
		// The SDKs URI-encode each key and value, then form-encode the
		// pairs into this one parameter.
		pairs, err := url.ParseQuery(raw)
		if err != nil {
			return f, fmt.Errorf("metadata filter %q: %v: %w", raw, err, errdefs.ErrInvalidArgument)
		}
		for k, vs := range pairs {
			key, err1 := url.PathUnescape(k)
			val, err2 := url.PathUnescape(vs[len(vs)-1])
			if err1 != nil || err2 != nil {
				return f, fmt.Errorf("metadata filter %q: bad escape: %w", raw, errdefs.ErrInvalidArgument)
			}
			f.Metadata[key] = val
		}
	}
	// The SDKs send the states comma-separated in one parameter; plain
	// form encoding repeats it. Both mean the union.
	states := strings.Join(q["state"], ",")
	if states == "" {
		states = "running,paused"
	}
	for _, st := range strings.Split(states, ",") {
		switch st {
		case "running":
			f.Running = true
		case "paused":
			f.Paused = true
		default:
			return f, fmt.Errorf("state %q: want running or paused: %w", st, errdefs.ErrInvalidArgument)
		}
	}
	f.Template = q.Get("template")
	for _, b := range []struct {
		name string
		to   *time.Time
	}{{"startedAfter", &f.StartedAfter}, {"startedBefore", &f.StartedBefore}} {
		raw := q.Get(b.name)
		if raw == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, raw)
		if err != nil {
			return f, fmt.Errorf("%s %q: want an RFC 3339 timestamp such as 2025-01-02T15:04:05Z: %w", b.name, raw, errdefs.ErrInvalidArgument)
		}
		*b.to = t
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		f.Asc = true
	default:
		return f, fmt.Errorf("order %q: want asc or desc: %w", o, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// Keeps reports whether a sandbox of template tpl started at started
// passes the template and start-time filters.
func (f ListQuery) Keeps(tpl string, started time.Time) bool {
	return (f.Template == "" || tpl == f.Template) &&
		(f.StartedAfter.IsZero() || !started.Before(f.StartedAfter)) &&
		(f.StartedBefore.IsZero() || !started.After(f.StartedBefore))
}

// MaxPage bounds one page of a listing.
const MaxPage = 100

// Cursor is a position in the order of sandboxes (or snapshots) by start
// time, ties broken by ID.
type Cursor struct {
	At int64
	ID string
}

// CursorAt is the cursor of an item started at t with ID id.
func CursorAt(t time.Time, id string) Cursor { return Cursor{At: t.UnixNano(), ID: id} }

// Compare orders cursors by time, then ID.
func (c Cursor) Compare(o Cursor) int {
	if c.At != o.At {
		return cmp.Compare(c.At, o.At)
	}
	return strings.Compare(c.ID, o.ID)
}

func (c Cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.At, 10) + ":" + c.ID))
}

// ParseCursor reads a nextToken.
func ParseCursor(s string) (Cursor, error) {
	bad := fmt.Errorf("nextToken %q is not one this server issued: %w", s, errdefs.ErrInvalidArgument)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, bad
	}
	at, id, ok := strings.Cut(string(raw), ":")
	n, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || types.ValidSandboxID(id) != nil {
		return Cursor{}, bad
	}
	return Cursor{At: n, ID: id}, nil
}

// PageQuery reads a listing's limit (default and ceiling MaxPage) and
// nextToken cursor; on a bad value it has answered 400 and returns ok
// false.
func PageQuery(w http.ResponseWriter, q url.Values) (limit int, after *Cursor, ok bool) {
	limit = MaxPage
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want a positive integer", l))
			return 0, nil, false
		}
		limit = min(n, MaxPage)
	}
	if t := q.Get("nextToken"); t != "" {
		c, err := ParseCursor(t)
		if err != nil {
			WriteErr(w, err)
			return 0, nil, false
		}
		after = &c
	}
	return limit, after, true
}

// Page is one page of items in a listing's order (asc or not), after the
// cursor after (nil: from the start), at most limit long; next is the
// cursor to continue from, "" when nothing is left.
func Page[T any](items []T, at func(T) Cursor, asc bool, after *Cursor, limit int) (page []T, next string) {
	page = make([]T, 0, min(limit, len(items)))
	var last Cursor
	for _, it := range items {
		c := at(it)
		if after != nil {
			// Skip up to and including the cursor, in the page order.
			if n := c.Compare(*after); (asc && n <= 0) || (!asc && n >= 0) {
				continue
			}
		}
		if len(page) == limit {
			// There is more: the client continues after the last one sent.
			return page, last.String()
		}
		page = append(page, it)
		last = c
	}
	return page, ""
}

// Listing is how a backend's sandbox records list in E2B's terms.
type Listing[T any] struct {
	// Cursor is a record's place in the order (start time, then ID).
	Cursor func(T) Cursor
	// Running reports whether the record's sandbox runs (not paused, not
	// still being made).
	Running func(T) bool
	// Listed is the record as E2B lists it.
	Listed func(T) ListedBody
}

// WriteAll answers GET /sandboxes: every item, in the order given.
func (l Listing[T]) WriteAll(w http.ResponseWriter, items []T) {
	out := make([]ListedBody, 0, len(items))
	for _, it := range items {
		out = append(out, l.Listed(it))
	}
	WriteJSON(w, http.StatusOK, out)
}

// WritePage answers GET /v2/sandboxes with one page of items (sorted in
// the order asc says) after the cursor after, at most limit of them: the
// header X-Total-Running counts every item that runs, and X-Next-Token is
// set when more are left. The next token is an opaque cursor (the last
// item's start time and ID): the next page holds what sorts after it, so
// sandboxes created or destroyed between two pages neither repeat nor
// shift what is left.
func (l Listing[T]) WritePage(w http.ResponseWriter, items []T, asc bool, after *Cursor, limit int) {
	running := 0
	for _, it := range items {
		if l.Running(it) {
			running++
		}
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(running))
	page, next := Page(items, l.Cursor, asc, after, limit)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	l.WriteAll(w, page)
}

// Target is the sandbox and port a data-plane request names: by the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers (the port defaults to
// envd's), else by a preview Host "<port>-<id>.<domain>". ok is false
// when the request names none; err is a bad port header.
func Target(r *http.Request, domain string, envdPort int) (id string, port int, ok bool, err error) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := envdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return id, 0, true, fmt.Errorf("invalid E2b-Sandbox-Port header %q: %w", p, errdefs.ErrInvalidArgument)
			}
			port = n
		}
		return id, port, true, nil
	}
	id, port, ok = ParseHost(r.Host, domain)
	return id, port, ok, nil
}

// SignedFiles reads a /files request signed as the SDKs' uploadUrl and
// downloadUrl sign it: the operation its method stands for ("read" for
// GET and HEAD, "write" for POST, "" for any other method) and its
// signature_expiration (0: none; a malformed one is an error).
func SignedFiles(r *http.Request) (op string, exp int64, err error) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	}
	if v := r.URL.Query().Get("signature_expiration"); v != "" {
		if exp, err = strconv.ParseInt(v, 10, 64); err != nil {
			return op, 0, fmt.Errorf("invalid signature_expiration %s", strconv.Quote(v))
		}
	}
	return op, exp, nil
}

// TrafficTokenHeader carries a sandbox's traffic access token on preview
// traffic when the sandbox was created with allowPublicTraffic: false.
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// SnapshotInfo is E2B's SnapshotInfo: a snapshot's ID (the ID a create
// names it by) and its names.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// InfoOf is the SnapshotInfo of snapshot id, named name ("" for none).
func InfoOf(id, name string) SnapshotInfo {
	names := []string{}
	if name != "" {
		names = append(names, name)
	}
	return SnapshotInfo{SnapshotID: id, Names: names}
}

// WriteSnapshotPage answers GET /snapshots with one page of snaps (the
// caller's, already filtered; their ID, Name and CreatedAt count), newest
// first, the next page's cursor in X-Next-Token.
func WriteSnapshotPage(w http.ResponseWriter, snaps []types.Snapshot, after *Cursor, limit int) {
	key := func(s types.Snapshot) Cursor { return CursorAt(s.CreatedAt, s.ID) }
	slices.SortFunc(snaps, func(a, b types.Snapshot) int { return key(b).Compare(key(a)) })
	page, next := Page(snaps, key, false, after, limit)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	out := make([]SnapshotInfo, 0, len(page))
	for _, s := range page {
		out = append(out, InfoOf(s.ID, s.Name))
	}
	WriteJSON(w, http.StatusOK, out)
}
