package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/review"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/worklog"
	"github.com/berth-sandbox/berth/internal/workspace"
)

// jsonFields is a struct's JSON object keys with their tag options.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		out = append(out, tag)
	}
	return out
}

// TestWireMirrorsInternal: where the API serves an internal type by plain
// conversion to its wire type, the compiler checks the fields and this
// checks the JSON names and options, so the answer cannot change shape.
func TestWireMirrorsInternal(t *testing.T) {
	pairs := []struct{ internal, wire any }{
		{audit.Record{}, types.NetworkRecord{}},
		{worklog.Entry{}, types.WorklogEntry{}},
		{review.CommitRequest{}, types.CommitRequest{}},
		{review.CommitResult{}, types.CommitResult{}},
		{policy.Policy{}, types.NetworkPolicy{}},
		{policy.HTTPRule{}, types.HTTPRule{}},
	}
	for _, p := range pairs {
		in, w := reflect.TypeOf(p.internal), reflect.TypeOf(p.wire)
		if got, want := jsonFields(in), jsonFields(w); !slices.Equal(got, want) {
			t.Errorf("%v JSON %v, wire %v JSON %v", in, got, w, want)
		}
	}
}

// TestWireConstants: the states and event types the wire lists are the
// ones the Manager uses.
func TestWireConstants(t *testing.T) {
	states := []string{string(sandbox.StateCreating), string(sandbox.StateReady), string(sandbox.StatePausing), string(sandbox.StatePaused), string(sandbox.StateResuming),
		string(sandbox.StateStopping), string(sandbox.StateStopped), string(sandbox.StateFailed)}
	if !slices.Equal(states, types.States) {
		t.Errorf("sandbox states %v, wire %v", states, types.States)
	}
	events := []string{
		sandbox.EventCreated, sandbox.EventReady, sandbox.EventAdopted, sandbox.EventOOM, sandbox.EventTimeoutChanged,
		sandbox.EventDeadline, sandbox.EventDestroyed, sandbox.EventFailed, sandbox.EventNetworkPolicy,
		workspace.EventSetupStarted, workspace.EventSetupStep, workspace.EventSetupDone, workspace.EventSetupCached,
		sandbox.EventPaused, sandbox.EventResumed, sandbox.EventPauseFailed, sandbox.EventResumeReady,
	}
	if !slices.Equal(events, types.EventTypes) {
		t.Errorf("sandbox events %v, wire %v", events, types.EventTypes)
	}
	if core.PauseMemory != types.PauseMemory || core.PauseFilesystem != types.PauseFilesystem ||
		core.OnTimeoutKill != types.OnTimeoutKill || core.OnTimeoutPause != types.OnTimeoutPause {
		t.Error("pause kinds or on-timeout actions differ between core and the wire")
	}
	modes := []string{string(policy.ModeNone), string(policy.ModeAllow), string(policy.ModeOpen), string(policy.ModeLearn)}
	if want := []string{types.NetNone, types.NetAllow, types.NetOpen, types.NetLearn}; !slices.Equal(modes, want) {
		t.Errorf("policy modes %v, wire %v", modes, want)
	}
	if isos := []string{types.IsolationRunc, types.IsolationGVisor}; !slices.Equal(isos, core.Isolations()) {
		t.Errorf("isolation levels %v, wire %v", core.Isolations(), isos)
	}
	if review.FormatPatch != types.ExportPatch || review.FormatBundle != types.ExportBundle {
		t.Errorf("export formats %q %q, wire %q %q", review.FormatPatch, review.FormatBundle, types.ExportPatch, types.ExportBundle)
	}
}

// TestOpenAPIEnums: the document's enums list the wire's states and event
// types.
func TestOpenAPIEnums(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `json:"enum"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Components.Schemas
	if got := s["Sandbox"].Properties["state"].Enum; !slices.Equal(got, types.States) {
		t.Errorf("openapi Sandbox.state enum %v, wire %v", got, types.States)
	}
	if got := s["Event"].Properties["type"].Enum; !slices.Equal(got, types.EventTypes) {
		t.Errorf("openapi Event.type enum %v, wire %v", got, types.EventTypes)
	}
}

// TestCreateCPUShadow: the server's createRequest reads an explicit
// "cpu": 0 as set (and refuses it), and keeps every other wire field.
func TestCreateCPUShadow(t *testing.T) {
	var in createRequest
	if err := decodeBytes([]byte(`{"cpu":0,"pids":7,"template":"base"}`), &in); err != nil {
		t.Fatal(err)
	}
	if in.CPU == nil || *in.CPU != 0 || in.PIDs != 7 || in.Template != "base" {
		t.Fatalf("decoded %+v (cpu %v)", in.CreateRequest, in.CPU)
	}
	if _, err := parseCreate(in); err == nil || !strings.Contains(err.Error(), "cpu") {
		t.Errorf("parseCreate(cpu 0) = %v, want a cpu error", err)
	}
	var ws workspaceRequest
	if err := decodeBytes([]byte(`{"cpu":0.5,"repo":"r","memory":"1G"}`), &ws); err != nil || ws.CPU == nil || *ws.CPU != 0.5 || ws.Repo != "r" || ws.Memory != "1G" {
		t.Errorf("workspace decoded %+v (cpu %v), %v", ws.WorkspaceRequest, ws.CPU, err)
	}
	// A wrong type in the embedded request names the field as the API
	// spells it, not the Go path through the embedding.
	for body, field := range map[string]string{`{"allow_sudo":"yes"}`: "allow_sudo", `{"timeout":5}`: "timeout", `{"cpu":"x"}`: "cpu"} {
		var fe *fieldError
		if err := decodeBytes([]byte(body), &in); !errors.As(err, &fe) || fe.field != field || strings.Contains(err.Error(), "CreateRequest") {
			t.Errorf("decode %s = %v, want an error on field %q", body, err, field)
		}
	}
}

// TestOpenAPISchemas: each schema of the document has exactly the JSON
// keys of its wire type.
func TestOpenAPISchemas(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := map[string]any{
		"Error": types.Error{}, "CreateRequest": types.CreateRequest{}, "Usage": types.Usage{}, "Sandbox": types.Sandbox{},
		"Event": types.Event{}, "Template": types.Template{}, "NetworkPolicy": types.NetworkPolicy{},
		"EgressRecord": types.NetworkRecord{}, "APIKey": types.APIKey{}, "WorklogEntry": types.WorklogEntry{},
		"IsolationLevel":        types.IsolationLevel{},
		"TemplateCreateRequest": types.TemplateCreateRequest{}, "TemplatePruneResult": types.TemplatePruneResult{},
		"Quota": types.Quota{}, "UsageRecord": types.UsageRecord{},
		"Snapshot": types.Snapshot{}, "SnapshotList": types.SnapshotList{}, "SnapshotRequest": types.SnapshotRequest{},
		"Volume": types.Volume{}, "VolumeList": types.VolumeList{}, "VolumeRequest": types.VolumeRequest{}, "VolumeMount": types.VolumeMount{},
		"VolumeEntry": types.VolumeEntry{}, "VolumeListing": types.VolumeListing{},
		"ForkRequest": types.ForkRequest{}, "ForkResult": types.ForkResult{},
		"ReadyCheck": types.ReadyCheck{}, "RegistryLoginRequest": types.RegistryLoginRequest{}, "RegistryLogin": types.RegistryLogin{},
		"WarmPool": types.WarmPool{}, "MetricSample": types.MetricSample{},
	}
	for name := range doc.Components.Schemas {
		if _, ok := schemas[name]; !ok {
			t.Errorf("openapi schema %s has no wire type in this test", name)
		}
	}
	for name, v := range schemas {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		var doc, wire []string
		for k := range s.Properties {
			doc = append(doc, k)
		}
		for _, f := range jsonFields(reflect.TypeOf(v)) {
			wire = append(wire, strings.Split(f, ",")[0])
		}
		slices.Sort(doc)
		slices.Sort(wire)
		if !slices.Equal(doc, wire) {
			t.Errorf("openapi schema %s has %v, wire type %v", name, doc, wire)
		}
	}
}
