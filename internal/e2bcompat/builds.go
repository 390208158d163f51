package e2bcompat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/template"
)

// Builds and their logs live in the daemon's store (core.TemplateBuild),
// so a status poll after a daemon restart still answers: a build the
// daemon was running when it died is reported as an error saying so. What
// is kept is bounded: the newest keptBuilds builds of each name, and at
// most maxLogLines lines of maxLogLine bytes per build.

// BuildStore keeps E2B template builds and their logs.
type BuildStore = core.TemplateBuildStore

// Build statuses, as E2B names them.
const (
	statusWaiting  = "waiting"
	statusBuilding = "building"
	statusReady    = "ready"
	statusError    = "error"
)

const (
	// keptBuilds is how many builds of one name are kept (a build still
	// running is never removed).
	keptBuilds = 20
	// maxLogLines bounds one build's log; past it, lines are dropped
	// (the error that ends a failed build is still logged).
	maxLogLines = 10000
	// maxLogLine bounds one line, in bytes.
	maxLogLine = 8 << 10
	// reasonLines is how many of its last lines a failed build's reason
	// carries.
	reasonLines = 20
)

// interruptedReason is the reason of a build the daemon was running when
// it stopped.
const interruptedReason = "the daemon restarted while this build ran; build again"

type logEntry struct {
	Timestamp string `json:"timestamp"`
	Level     string `json:"level"`
	Message   string `json:"message"`
	Step      string `json:"step,omitempty"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

type requestBody struct {
	Name     string   `json:"name"`
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

// request answers POST /v3/templates: a build, waiting for its trigger.
func (t *templateAPI) request(w http.ResponseWriter, r *http.Request) {
	var in requestBody
	if err := decode(r, &in); err != nil {
		writeErr(w, err)
		return
	}
	name, tag, err := splitName(in.Name)
	if err != nil {
		writeErr(w, fmt.Errorf("name: %w", err))
		return
	}
	tags := slices.Clone(in.Tags)
	if tag != "" {
		tags = append(tags, tag)
	}
	if msg := badTag(tags); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if len(tags) == 0 {
		tags = []string{defaultTag}
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	now := time.Now().UTC()
	job := core.TemplateBuild{ID: newBuildID(), Template: name, Target: name, Tags: tags, Status: statusWaiting, CreatedAt: now, UpdatedAt: now}
	if !slices.Contains(tags, defaultTag) {
		job.Target = name + "-" + job.ID[:8]
		if err := template.ValidName(job.Target); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("name %q: at most 54 characters when the build has no default tag (its template is NAME-<build>)", name))
			return
		}
	}
	if err := t.store.PutTemplateBuild(r.Context(), job); err != nil {
		writeErr(w, err)
		return
	}
	if err := t.store.PruneBuilds(r.Context(), name, keptBuilds); err != nil {
		t.log.Warn("prune_builds", "template", name, "err", err)
	}
	t.mu.Lock()
	t.waiting[name]++
	t.mu.Unlock()
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": job.ID, "public": false,
		"aliases": []string{name}, "names": []string{name}, "tags": tags,
	})
}

func newBuildID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// trigger answers POST /v2/templates/{id}/builds/{build}: the steps, run
// in the background.
func (t *templateAPI) trigger(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("buildID"), r.PathValue("templateID")
	t.mu.Lock()
	job, err := t.store.GetTemplateBuild(r.Context(), id)
	ok := err == nil && job.Template == name && job.Status == statusWaiting && !t.starting[id]
	if ok {
		t.starting[id] = true
	}
	t.mu.Unlock()
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		writeErr(w, err)
		return
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %q of template %q not found, or already started", id, name))
		return
	}
	var in triggerBody
	err = decode(r, &in)
	var req dockerfile.Request
	var ctxDir string
	if err == nil {
		req, ctxDir, err = t.plan(job, in)
	}
	if err == nil {
		job.Status, job.UpdatedAt = statusBuilding, time.Now().UTC()
		if err = t.store.PutTemplateBuild(r.Context(), job); err != nil {
			removeDir(ctxDir)
		}
	}
	t.mu.Lock()
	delete(t.starting, id)
	if err == nil && t.waiting[name] > 0 {
		t.waiting[name]--
	}
	t.mu.Unlock()
	if err != nil {
		if errors.Is(err, errNotImplemented) {
			writeError(w, http.StatusNotImplemented, err.Error())
			return
		}
		writeErr(w, err)
		return
	}
	hashes := copyHashes(in.Steps)
	t.useUploads(hashes)
	go t.run(job, req, ctxDir, hashes)
	w.WriteHeader(http.StatusAccepted)
}

// run runs a triggered build and records its end.
func (t *templateAPI) run(job core.TemplateBuild, req dockerfile.Request, ctxDir string, hashes []string) {
	defer t.releaseUploads(job.Template, hashes)
	defer removeDir(ctxDir)
	lw := &jobLog{t: t, id: job.ID}
	_, err := t.b.BuildPlan(t.ctx, req, lw)
	lw.flush()
	// The end is recorded even when the daemon is stopping.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), 30*time.Second)
	defer cancel()
	if err == nil {
		t.mu.Lock()
		err = t.tagLocked(job.Template, job.Tags, tagEntry{BuildID: job.ID, Template: job.Target, Created: time.Now().UTC()})
		t.mu.Unlock()
	}
	job.Status, job.UpdatedAt = statusReady, time.Now().UTC()
	if err != nil {
		step := ""
		var se *dockerfile.StepError
		if errors.As(err, &se) {
			step = "base"
			if se.Line > 0 {
				step = strconv.Itoa(se.Line)
			}
		}
		job.Status, job.Reason, job.ReasonStep = statusError, err.Error(), step
		// Past the cap too: the error is the line a reader wants.
		lw.append(ctx, []core.BuildLogEntry{{Time: job.UpdatedAt, Level: "error", Message: truncLine(job.Reason), Step: step}})
	}
	if err := t.store.PutTemplateBuild(ctx, job); err != nil {
		t.log.Error("record_build", "build_id", job.ID, "err", err)
	}
}

// jobLog turns a build's log into its stored lines, a line each.
type jobLog struct {
	t       *templateAPI
	id      string
	n       int // lines stored so far
	partial []byte
}

func (l *jobLog) Write(p []byte) (int, error) {
	l.partial = append(l.partial, p...)
	var lines []core.BuildLogEntry
	now := time.Now().UTC()
	for {
		i := slices.Index(l.partial, '\n')
		if i < 0 {
			if len(l.partial) > maxLogLine {
				// A line without end (a progress bar) is cut.
				i = maxLogLine
			} else {
				break
			}
		}
		lines = append(lines, core.BuildLogEntry{Time: now, Level: "info", Message: truncLine(string(l.partial[:i]))})
		l.partial = l.partial[min(i+1, len(l.partial)):]
	}
	l.add(lines)
	return len(p), nil
}

func (l *jobLog) flush() {
	if len(l.partial) > 0 {
		l.add([]core.BuildLogEntry{{Time: time.Now().UTC(), Level: "info", Message: truncLine(string(l.partial))}})
		l.partial = nil
	}
}

// add stores lines up to the cap; the line that reaches it says so.
func (l *jobLog) add(lines []core.BuildLogEntry) {
	room := maxLogLines - 1 - l.n
	if room < 0 || len(lines) == 0 {
		return
	}
	if len(lines) > room {
		lines = append(lines[:room], core.BuildLogEntry{Time: time.Now().UTC(), Level: "warn",
			Message: fmt.Sprintf("the build log is cut at %d lines; later lines are dropped", maxLogLines)})
	}
	l.append(l.t.ctx, lines)
}

// append stores lines as the next ones, in batches the database takes.
func (l *jobLog) append(ctx context.Context, lines []core.BuildLogEntry) {
	for chunk := range slices.Chunk(lines, 500) {
		if err := l.t.store.AppendBuildLog(ctx, l.id, l.n, chunk); err != nil {
			l.t.log.Warn("build_log", "build_id", l.id, "err", err)
			return
		}
		l.n += len(chunk)
	}
}

// truncLine bounds one log line.
func truncLine(s string) string {
	if len(s) <= maxLogLine {
		return s
	}
	return s[:maxLogLine] + "…"
}

func toEntries(in []core.BuildLogEntry) []logEntry {
	// Never null: the SDK maps logEntries without a nil check, and a
	// build polled before its first log line has none yet.
	out := make([]logEntry, 0, len(in))
	for _, e := range in {
		out = append(out, logEntry{Timestamp: e.Time.Format(time.RFC3339Nano), Level: e.Level, Message: e.Message, Step: e.Step})
	}
	return out
}

// status answers GET /templates/{id}/builds/{build}/status: the state and
// the log entries from ?logsOffset= on.
func (t *templateAPI) status(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("buildID"), r.PathValue("templateID")
	off := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("logsOffset %q: want a number >= 0", v))
			return
		}
		off = n
	}
	job, err := t.store.GetTemplateBuild(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && job.Template != name) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %q of template %q not found (the newest %d builds of each template are kept)", id, name, keptBuilds))
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	lines, err := t.store.BuildLog(r.Context(), id, off)
	if err != nil {
		writeErr(w, err)
		return
	}
	entries := toEntries(lines)
	logs := make([]string, len(entries))
	for i, e := range entries {
		logs[i] = e.Message
	}
	body := map[string]any{
		"templateID": job.Template, "buildID": job.ID, "status": job.Status,
		"logEntries": entries, "logs": logs,
		// Berth's own, for the Kubernetes gateway (which records a
		// build its node ran as the cluster's): the Berth template the
		// build makes, its tags and when it was asked for.
		e2bwire.BuildTemplateField: job.Target, e2bwire.BuildTagsField: job.Tags,
		e2bwire.BuildRequestedField: job.CreatedAt, e2bwire.BuildUpdatedField: job.UpdatedAt,
	}
	if job.Status == statusReady {
		// The build the template is now (the gateway waits for its
		// node to report this one, not the one before it).
		if tpl, err := t.b.Template(r.Context(), job.Target); err == nil && tpl.Built {
			body[e2bwire.BuildIDField] = tpl.BuildID
		}
	}
	if job.Status == statusError {
		tail, err := t.store.BuildLogTail(r.Context(), id, reasonLines)
		if err != nil {
			writeErr(w, err)
			return
		}
		body["reason"] = buildReason{Message: job.Reason, Step: job.ReasonStep, LogEntries: toEntries(tail)}
	}
	writeJSON(w, http.StatusOK, body)
}
