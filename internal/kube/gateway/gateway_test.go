package gateway

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

const ns = "sandboxes"

// Templates the fake node reacts to: its pods fail, or no node can take
// them.
const (
	tplFails   = "fails"
	tplNoRoom  = "noroom"
	tplHangs   = "hangs"
	keyAlice   = "e2b_00000000000000000000000000000000000000a1"
	keyBob     = "e2b_00000000000000000000000000000000000000b2"
	keyCarol   = "e2b_00000000000000000000000000000000000000c3"
	nodeSbPref = "nodesb"
)

// testCA issues the node's serving certificate and the gateway's client
// certificate, as a cluster's CA would.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	n    int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), n: 1}
}

// issue returns PEM certificate and key, for 127.0.0.1 when server.
func (ca *testCA) issue(t *testing.T, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeNode is a node's kubelet API server as the gateway sees it: mutual
// TLS, and under /berth/ what the agent would answer (it echoes the path,
// the query, the headers that matter and the body).
func fakeNode(t *testing.T, ca *testCA) *httptest.Server {
	t.Helper()
	var snaps atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Got-Path", r.URL.Path)
		w.Header().Set("X-Got-Query", r.URL.RawQuery)
		w.Header().Set("X-Got-Key", r.Header.Get("X-API-Key"))
		w.Header().Set("X-Got-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Got-Host", r.Header.Get("X-Forwarded-Host"))
		w.Header().Set("X-Got-Secrets", r.Header.Get("E2b-Traffic-Access-Token")+r.Header.Get("X-Access-Token"))
		if sb, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/sandboxes/"), "/snapshots"); ok && r.Method == "POST" {
			// The daemon's snapshot of a pod's sandbox carries the
			// node's labels.
			var in types.SnapshotRequest
			_ = json.Unmarshal(body, &in)
			_ = json.NewEncoder(w).Encode(types.Snapshot{ID: "snap" + strconv.FormatInt(snaps.Add(1), 10), Name: in.Name, Source: sb, Kind: types.SnapshotFilesystem, Template: "minimal",
				Labels: map[string]string{node.LabelNode: "berth-a"}, CreatedAt: time.Now()})
			return
		}
		if strings.HasPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/snapshots/") && strings.HasSuffix(r.URL.Path, "/export") && r.Method == "GET" {
			_, _ = io.WriteString(w, "archive")
			return
		}
		if r.URL.Path == node.DataPlanePrefix+"/v1/snapshots/import" && r.Method == "POST" {
			// The daemon's import, labelled the node's.
			if string(body) != "archive" {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "file", Message: "not an archive"})
				return
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(types.Snapshot{ID: "imp" + strconv.FormatInt(snaps.Add(1), 10), Source: "elsewhere", Kind: types.SnapshotFilesystem, Template: "minimal",
				Labels: map[string]string{node.LabelNode: "berth-a", node.LabelPodName: "p", "team": "x"}, CreatedAt: time.Now()})
			return
		}
		if id, ok := strings.CutPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/snapshots/"); ok && r.Method == "DELETE" {
			if strings.HasSuffix(id, "busy") {
				w.WriteHeader(http.StatusConflict)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeFailedPrecondition, Message: "snapshot " + id + " is in use by x: destroy those first"})
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.URL.Path == node.DataPlanePrefix+"/v1/templates" && r.Method == "POST" {
			// The daemon's template from an image: refused before its
			// stream for an image that does not exist, else a stream.
			var in types.TemplateCreateRequest
			_ = json.Unmarshal(body, &in)
			if in.Image == "registry.example/nope:1" {
				w.WriteHeader(http.StatusNotFound)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeNotFound, Field: "image", Message: "image " + in.Image + " not found"})
				return
			}
			line := "pulling " + in.Image + "\n"
			enc := json.NewEncoder(w)
			_ = enc.Encode(types.BuildLine{Log: &line})
			_ = enc.Encode(types.BuildLine{Template: &types.Template{Name: in.Name, Built: true, Source: "image " + in.Image, SizeBytes: 3 << 20}})
			return
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/templates/"), "/dockerfile"); ok && r.Method == "POST" {
			// A Dockerfile build: what came, then the template.
			line := fmt.Sprintf("context %q (%s), query %s\n", body, r.Header.Get("Content-Type"), r.URL.RawQuery)
			enc := json.NewEncoder(w)
			_ = enc.Encode(types.BuildLine{Log: &line})
			_ = enc.Encode(types.BuildLine{Template: &types.Template{Name: name, Built: true, Source: "dockerfile"}})
			return
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/templates/"), "/build"); ok && r.Method == "POST" {
			line := "building " + name + "\n"
			enc := json.NewEncoder(w)
			_ = enc.Encode(types.BuildLine{Log: &line})
			if name == "broken" {
				_ = enc.Encode(types.BuildLine{Error: &types.Error{Code: errdefs.CodeInternal, Message: "step 2 failed"}})
				return
			}
			_ = enc.Encode(types.BuildLine{Template: &types.Template{Name: name, Built: true}})
			return
		}
		if host, ok := strings.CutPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/registries"); ok {
			// The daemon's registry logins: ghcr.io only.
			host = strings.TrimPrefix(host, "/")
			switch {
			case r.Method == "GET":
				_ = json.NewEncoder(w).Encode(types.RegistryList{Registries: []types.RegistryLogin{{Registry: "ghcr.io", Username: "ci"}}})
			case r.Method == "PUT" && strings.Contains(string(body), `"password":"wrong"`):
				w.WriteHeader(http.StatusUnauthorized)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeUnauthenticated, Message: host + " refused the login"})
			case r.Method == "PUT":
				var in types.RegistryLoginRequest
				_ = json.Unmarshal(body, &in)
				_ = json.NewEncoder(w).Encode(types.RegistryLogin{Registry: host, Username: in.Username})
			case host == "ghcr.io":
				w.WriteHeader(http.StatusNoContent)
			default:
				w.WriteHeader(http.StatusNotFound)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeNotFound, Message: "no login for " + host})
			}
			return
		}
		if rest, ok := strings.CutPrefix(r.URL.Path, node.DataPlanePrefix+node.E2BPrefix); ok {
			// The daemon's E2B template builds: build b1 of "app",
			// asked for an hour ago, ready now.
			w.Header().Set("X-Got-Body", string(body))
			w.Header().Set("Content-Type", "application/json")
			switch {
			case r.Method == "POST" && rest == "/v3/templates":
				w.WriteHeader(http.StatusAccepted)
				_, _ = io.WriteString(w, `{"templateID":"app","buildID":"b1","tags":["default","v1"]}`)
			case r.Method == "GET" && strings.Contains(rest, "/files/"):
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"present":false,"url":"http://berth%s?expires=1&signature=s"}`, rest)
			case r.Method == "GET" && rest == "/templates/app/builds/b1/status":
				_ = json.NewEncoder(w).Encode(map[string]any{"templateID": "app", "buildID": "b1", "status": "ready", "logEntries": []any{}, "logs": []string{"built"},
					e2bwire.BuildTemplateField: "app", e2bwire.BuildTagsField: []string{"default", "v1"},
					e2bwire.BuildRequestedField: time.Now().Add(-time.Hour), e2bwire.BuildUpdatedField: time.Now(),
					e2bwire.BuildIDField: strings.Repeat("a1", 16)})
			case strings.Contains(rest, "/builds/") && !strings.Contains(rest, "/b1"):
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, `{"code":404,"message":"build not found"}`)
			default:
				w.WriteHeader(http.StatusAccepted)
			}
			return
		}
		if r.URL.Path == node.DataPlanePrefix+"/v1/templates/prune" && r.Method == "POST" {
			_ = json.NewEncoder(w).Encode(types.TemplatePruneResult{RemovedLayers: 2, FreedBytes: 5 << 20})
			return
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/templates/"), "/isolation"); ok && r.Method == "PUT" {
			var in types.TemplateIsolationRequest
			_ = json.Unmarshal(body, &in)
			_ = json.NewEncoder(w).Encode(types.Template{Name: name, Built: true, Isolation: in.Isolation})
			return
		}
		if _, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/templates/"), "/warm"); ok && r.Method == "PUT" {
			var in types.WarmRequest
			_ = json.Unmarshal(body, &in)
			if *in.Target > 64 {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "target", Message: "target 65: want 0 to 64"})
				return
			}
			_ = json.NewEncoder(w).Encode(types.WarmPool{Target: *in.Target, Ready: *in.Target / 2, AllowSudo: in.AllowSudo})
			return
		}
		if name, ok := strings.CutPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/templates/"); ok && r.Method == "DELETE" {
			if seen := onTemplateDelete.Load(); seen != nil {
				(*seen)(name)
			}
			switch name {
			case "inuse":
				w.WriteHeader(http.StatusConflict)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeFailedPrecondition, Message: "template \"inuse\" is in use by 1 sandbox(es)"})
			case "nope":
				w.WriteHeader(http.StatusNotFound)
				_ = json.NewEncoder(w).Encode(errdefs.Error{Code: errdefs.CodeNotFound, Message: "no template nope"})
			default:
				w.WriteHeader(http.StatusNoContent)
			}
			return
		}
		if r.URL.Path == node.DataPlanePrefix+"/v1/templates" && r.Method == "GET" {
			// The daemon's templates: minimal built (with a pool of
			// the daemon's own), base not yet.
			_ = json.NewEncoder(w).Encode(types.TemplateList{Templates: []types.Template{
				{Name: "minimal", Built: true, SizeBytes: 1 << 20, Warm: &types.WarmPool{Target: 1, Ready: 1}},
				{Name: "base"},
			}})
			return
		}
		if _, ok := strings.CutSuffix(r.URL.Path, "/events"); ok && r.Method == "GET" && r.URL.Query().Get("follow") == "" {
			// The daemon's events of the sandbox.
			_ = json.NewEncoder(w).Encode(types.EventList{Events: []types.Event{{Time: time.Now().Add(-time.Minute), Type: types.EventReady}}})
			return
		}
		if _, ok := strings.CutSuffix(r.URL.Path, "/worklog"); ok && r.Method == "GET" && r.URL.Query().Get("follow") == "" {
			// The daemon's work log of the sandbox: one command.
			_ = json.NewEncoder(w).Encode(types.WorklogEntryList{Entries: []types.WorklogEntry{{Time: time.Now().Add(-30 * time.Second), Kind: "exec", Cmd: "ls", Exited: true, Done: true}}})
			return
		}
		if _, ok := strings.CutSuffix(r.URL.Path, "/metrics"); ok && r.Method == "GET" {
			// The daemon's readings of the sandbox: one every 5 s, at 40,
			// 45 and 50 MiB, the last 10 s ago; and one taken now when
			// the range has no end.
			now := time.Now()
			all := []types.MetricSample{}
			for i := range 3 {
				all = append(all, types.MetricSample{Time: now.Add(time.Duration(i*5-20) * time.Second), CPUs: 1, CPUSeconds: float64(i), CPUPercent: 20,
					MemoryBytes: int64(40+5*i) << 20, MemoryLimitBytes: 512 << 20, DiskUsedBytes: 5 << 20, DiskBytes: 1 << 30})
			}
			q := r.URL.Query()
			if q.Get("until") == "" {
				all = append(all, types.MetricSample{Time: now, CPUs: 1, CPUSeconds: 3, CPUPercent: 10, MemoryBytes: 60 << 20, MemoryLimitBytes: 512 << 20, DiskBytes: 1 << 30})
			}
			since, _ := time.Parse(time.RFC3339Nano, q.Get("since"))
			until, _ := time.Parse(time.RFC3339Nano, q.Get("until"))
			out := []types.MetricSample{}
			for _, m := range all {
				if !m.Time.Before(since) && (until.IsZero() || !m.Time.After(until)) {
					out = append(out, m)
				}
			}
			_ = json.NewEncoder(w).Encode(out)
			return
		}
		if rest, ok := strings.CutPrefix(r.URL.Path, node.DataPlanePrefix+"/v1/sandboxes/"); ok && r.Method == "GET" && !strings.Contains(rest, "/") {
			// The daemon's view of the sandbox, with its usage.
			_ = json.NewEncoder(w).Encode(types.Sandbox{ID: rest, State: types.StateReady, CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30,
				CreatedAt: time.Now().Add(-10 * time.Second), Usage: &types.Usage{CPUSeconds: 1, MemoryBytes: 40 << 20, DiskUsedBytes: 5 << 20}})
			return
		}
		_, _ = w.Write(body)
	}))
	certPEM, keyPEM := ca.issue(t, true)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// runNode plays the Berth node and the scheduler on the fake cluster:
// a new pod is bound and runs with a sandbox, or fails, or cannot be
// placed, as its template says.
func runNode(t *testing.T, kube *fake.Clientset) {
	t.Helper()
	w, err := kube.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { w.Stop(); <-done })
	go func() {
		defer close(done)
		n := 0
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ok && ev.Type == watch.Modified {
				applyNetwork(t, kube, pod)
			}
			if !ok || ev.Type != watch.Added {
				continue
			}
			n++
			pod = pod.DeepCopy()
			switch pod.Annotations[node.AnnotationTemplate] {
			case tplFails:
				pod.Spec.NodeName = "berth-a"
				pod.Status.Phase, pod.Status.Reason, pod.Status.Message = corev1.PodFailed, "BerthCreateFailed", "template is broken"
			case tplHangs:
				continue
			case tplNoRoom:
				pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
					Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 Insufficient memory."}}
			default:
				pod.Spec.NodeName = "berth-a"
				pod.Status.Phase = corev1.PodRunning
				pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName,
					ContainerID: "berth://" + nodeSbPref + strconv.Itoa(n) + "/" + containerName,
					State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			}
			// A pod deleted before the node got to it (a refused create)
			// is no failure.
			if _, err := kube.CoreV1().Pods(ns).Update(t.Context(), pod, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("node: update pod %s: %v", pod.Name, err)
			}
		}
	}()
}

// applyNetwork plays the node's side of a running pod's network and
// pause annotations: it reports the network value applied in
// node.ConditionNetwork, or refused with permission_denied (as an
// operator's ceiling would) when it allows refused.example, and the pause
// done in node.ConditionPaused.
func applyNetwork(t *testing.T, kube *fake.Clientset, pod *corev1.Pod) {
	v := pod.Annotations[node.AnnotationNetwork]
	if pod.Status.Phase != corev1.PodRunning {
		return
	}
	if done, _ := node.NetworkStatus(pod, v); done {
		if done, _ := node.PauseStatus(pod, pod.Annotations[node.AnnotationPaused]); done {
			return
		}
	}
	c := corev1.PodCondition{Type: node.ConditionNetwork, Status: corev1.ConditionTrue, Reason: node.NetworkApplied,
		Message: "policy " + node.NetworkHash(v) + " applied"}
	if strings.Contains(v, "refused.example") {
		c.Status, c.Reason = corev1.ConditionFalse, node.NetworkRefused
		c.Message = "policy " + node.NetworkHash(v) + " refused: permission_denied: allow[0] \"refused.example\": beyond the operator's ceiling"
	}
	// The pause annotation too: a filesystem pause, as on runc; refused
	// as a daemon refuses a memory image its disk has no room for when
	// the sandbox's labels (or E2B metadata) say so.
	pc := corev1.PodCondition{Type: node.ConditionPaused, Status: corev1.ConditionFalse, Reason: node.PauseRunning, Message: "running"}
	if pv := pod.Annotations[node.AnnotationPaused]; pv != "" {
		pc = corev1.PodCondition{Type: node.ConditionPaused, Status: corev1.ConditionTrue, Reason: node.PausePaused,
			Message: "pause " + node.NetworkHash(pv) + " applied: filesystem"}
		if strings.Contains(pod.Annotations[AnnotationLabels]+pod.Annotations[AnnotationE2BMetadata], `"disk":"full"`) {
			pc = corev1.PodCondition{Type: node.ConditionPaused, Status: corev1.ConditionFalse, Reason: node.PauseRefused,
				Message: "pause " + node.NetworkHash(pv) + " refused: " + errdefs.CodeResourceExhausted + ": " + noRoomWords}
		}
	}
	// The status alone, as a node writes it: a late event's copy of the
	// pod must not put back annotations changed since.
	conds := append(slices.DeleteFunc(slices.Clone(pod.Status.Conditions), func(c corev1.PodCondition) bool {
		return c.Type == node.ConditionNetwork || c.Type == node.ConditionPaused
	}), c, pc)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds}})
	if err != nil {
		t.Error(err)
		return
	}
	if _, err := kube.CoreV1().Pods(ns).Patch(t.Context(), pod.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("node: patch pod %s: %v", pod.Name, err)
	}
}

// noRoomWords is how the fake node's daemon refuses a pause for want of
// disk room (the words of sandbox.claimImageRoom).
const noRoomWords = "pause sandbox x: no room on the disk for its memory image: it needs 320 MiB in /var/lib/berth/checkpoints, which has 100 MiB free (0 MiB claimed by images being written)"

// onTemplateDelete, when set, is called by the fake node as it is asked
// to delete a template, before it answers.
var onTemplateDelete atomic.Pointer[func(name string)]

type env struct {
	kube *fake.Clientset
	url  string
	g    *Gateway
}

func startGateway(t *testing.T, withKeys bool) env {
	t.Helper()
	ca := newTestCA(t)
	nodeSrv := fakeNode(t, ca)
	addr := nodeSrv.Listener.Addr().(*net.TCPAddr)
	kube := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "berth-a", Labels: map[string]string{node.TaintKey: "true"},
			Annotations: map[string]string{node.AnnotationTemplates: "minimal," + tplFails + "," + tplNoRoom + "," + tplHangs}},
		Status: corev1.NodeStatus{
			Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(addr.Port)}},
		},
	})
	runNode(t, kube)
	certPEM, keyPEM := ca.issue(t, false)
	tr, err := NodeTransport(writeFile(t, "c.pem", certPEM), writeFile(t, "k.pem", keyPEM), writeFile(t, "ca.pem", ca.pem))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Kube: kube, Namespace: ns, NodeTransport: tr, DefaultTemplate: "minimal", CreateTimeout: time.Minute,
		Logger: slog.New(slog.DiscardHandler)}
	if withKeys {
		keys := "keys:\n" +
			"  - {id: alice, sha256: " + auth.HashKey(keyAlice) + "}\n" +
			"  - {id: bob, sha256: " + auth.HashKey(keyBob) + "}\n" +
			"  - {id: carol, sha256: " + auth.HashKey(keyCarol) + ", quota: {max_sandboxes: 2, max_memory: 384M, max_timeout: 1h}}\n"
		if cfg.Keys, err = LoadKeys(writeFile(t, "keys.yaml", []byte(keys))); err != nil {
			t.Fatal(err)
		}
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Shutdown)
	if err := g.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return env{kube: kube, url: srv.URL, g: g}
}

// call sends a request with key (if any) and decodes a JSON answer into out
// (if any), returning the status and the error body.
func (e env) call(t *testing.T, method, path, key, body string, out any) (int, errdefs.Error) {
	t.Helper()
	status, data, _ := e.e2bCall(t, method, path, key, body, nil)
	var e2 errdefs.Error
	if status >= 400 {
		if err := json.Unmarshal(data, &e2); err != nil {
			t.Fatalf("%s %s: %d with a body that is no JSON error: %q", method, path, status, data)
		}
	} else if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v in %q", method, path, err, data)
		}
	}
	return status, e2
}

func (e env) podNames(t *testing.T) []string {
	t.Helper()
	list, err := e.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		out = append(out, p.Name)
	}
	return out
}

func TestCreateGetListDelete(t *testing.T) {
	e := startGateway(t, false)
	var sb types.Sandbox
	code, eb := e.call(t, "POST", "/v1/sandboxes", "", `{"template":"minimal","cpu":0.5,"memory":"256M","isolation":"gvisor","network":{"mode":"allow","allow":["PyPI.org."]},"env":{"A":"1"},"labels":{"team":"x"},"timeout":"90s","user":"agent","allow_sudo":true}`, &sb)
	if code != http.StatusCreated {
		t.Fatalf("create = %d %+v", code, eb)
	}
	if sb.State != types.StateReady || sb.Template != "minimal" || sb.CPU != 0.5 || sb.MemoryBytes != 256<<20 || sb.Isolation != "gvisor" || sb.Labels["team"] != "x" || sb.Env["A"] != "1" {
		t.Errorf("created = %+v", sb)
	}
	if types.ValidSandboxID(sb.ID) != nil {
		t.Errorf("id %q is not a sandbox ID", sb.ID)
	}
	pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelManagedBy] != ManagedBy || pod.Annotations[node.AnnotationIsolation] != "gvisor" ||
		pod.Annotations[node.AnnotationNetwork] != `{"mode":"allow","allow":["pypi.org"]}` || pod.Spec.ActiveDeadlineSeconds != nil ||
		pod.Annotations[AnnotationOnNodeLost] != types.OnNodeLostFail || pod.Annotations[node.AnnotationUser] != "agent" || pod.Annotations[node.AnnotationAllowSudo] != "true" {
		t.Errorf("pod = labels %v annotations %v active deadline %v", pod.Labels, pod.Annotations, pod.Spec.ActiveDeadlineSeconds)
	}
	if dl, err := time.Parse(time.RFC3339, pod.Annotations[node.AnnotationDeadline]); err != nil || !dl.Equal(sb.Deadline) || !dl.After(pod.CreationTimestamp.Add(89*time.Second)) {
		t.Errorf("deadline annotation %q (%v), sandbox deadline %v", pod.Annotations[node.AnnotationDeadline], err, sb.Deadline)
	}
	if tol := pod.Spec.Tolerations; len(tol) != 1 || tol[0].Key != node.TaintKey {
		t.Errorf("tolerations = %+v", tol)
	}
	if lim := pod.Spec.Containers[0].Resources.Limits; lim.Cpu().MilliValue() != 500 || lim.Memory().Value() != 256<<20 {
		t.Errorf("limits = %v", lim)
	}

	var got types.Sandbox
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID, "", "", &got); code != 200 || got.ID != sb.ID || got.State != types.StateReady {
		t.Errorf("get = %d %+v %+v", code, got, eb)
	}
	var list types.SandboxList
	if code, _ := e.call(t, "GET", "/v1/sandboxes?label=team=x", "", "", &list); code != 200 || len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("list team=x = %d %+v", code, list)
	}
	if code, _ := e.call(t, "GET", "/v1/sandboxes?label=team=y", "", "", &list); code != 200 || len(list.Sandboxes) != 0 {
		t.Errorf("list team=y = %d %+v", code, list)
	}
	if code, eb := e.call(t, "DELETE", "/v1/sandboxes/"+sb.ID, "", "", nil); code != http.StatusNoContent {
		t.Errorf("delete = %d %+v", code, eb)
	}
	if names := e.podNames(t); len(names) != 0 {
		t.Errorf("pods after delete: %v", names)
	}
	if code, eb := e.call(t, "GET", "/v1/sandboxes/nosuchsandbox", "", "", nil); code != 404 || eb.Code != errdefs.CodeNotFound {
		t.Errorf("get unknown = %d %+v", code, eb)
	}
}

// TestCreateRefused: bad input names its field and makes no pod; a pod
// that fails or finds no node is answered with why, and deleted.
func TestCreateRefused(t *testing.T) {
	e := startGateway(t, false)
	for _, tc := range []struct {
		body         string
		status       int
		code, field  string
		madeThenGone bool
	}{
		{`{"isolation":"vm"}`, 400, errdefs.CodeInvalidArgument, "isolation", false},
		{`{"template":"nosuch"}`, 404, errdefs.CodeNotFound, "template", false},
		{`{"memory":"lots"}`, 400, errdefs.CodeInvalidArgument, "memory", false},
		{`{"cpu":0}`, 400, errdefs.CodeInvalidArgument, "cpu", false},
		{`{"timeout":"-1s"}`, 400, errdefs.CodeInvalidArgument, "timeout", false},
		{`{"timeout":"48h"}`, 400, errdefs.CodeInvalidArgument, "timeout", false},
		{`{"bogus":1}`, 400, errdefs.CodeInvalidArgument, "bogus", false},
		{`{"user":"bad user"}`, 400, errdefs.CodeInvalidArgument, "user", false},
		{`{"user":"root;"}`, 400, errdefs.CodeInvalidArgument, "user", false},
		{`{"allow_sudo":"yes"}`, 400, errdefs.CodeInvalidArgument, "allow_sudo", false},
		{`{"disk":"1G"}`, 501, errdefs.CodeNotImplemented, "disk", false},
		{`{"on_timeout":"hibernate"}`, 400, errdefs.CodeInvalidArgument, "on_timeout", false},
		{`{"idle_pause":"soon"}`, 400, errdefs.CodeInvalidArgument, "idle_pause", false},
		{`{"idle_pause":"0s"}`, 400, errdefs.CodeInvalidArgument, "idle_pause", false},
		{`{"snapshot":"s1"}`, 404, errdefs.CodeNotFound, "snapshot", false},
		{`{"template":"` + tplFails + `"}`, 409, errdefs.CodeFailedPrecondition, "", true},
		{`{"template":"` + tplNoRoom + `"}`, 429, errdefs.CodeResourceExhausted, "", true},
	} {
		before := len(e.kube.Actions())
		code, eb := e.call(t, "POST", "/v1/sandboxes", "", tc.body, nil)
		if code != tc.status || eb.Code != tc.code || eb.Field != tc.field {
			t.Errorf("create %s = %d %+v, want %d %s on field %q", tc.body, code, eb, tc.status, tc.code, tc.field)
		}
		var creates, deletes int
		for _, a := range e.kube.Actions()[before:] {
			if a.GetResource().Resource == "pods" {
				switch a.GetVerb() {
				case "create":
					creates++
				case "delete":
					deletes++
				}
			}
		}
		if tc.madeThenGone && (creates != 1 || deletes != 1) || !tc.madeThenGone && creates != 0 {
			t.Errorf("create %s: %d pod creates, %d deletes", tc.body, creates, deletes)
		}
		if names := e.podNames(t); len(names) != 0 {
			t.Errorf("create %s left pods %v", tc.body, names)
		}
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes", "", `{"template":"`+tplFails+`"}`, nil); code != 409 || !strings.Contains(eb.Message, "template is broken") {
		t.Errorf("failed pod's answer = %+v, want the node's message", eb)
	}
}

// TestKeys: with keys, a caller needs one, and sees only its sandboxes;
// another key's answer not found.
func TestKeys(t *testing.T) {
	e := startGateway(t, true)
	if code, eb := e.call(t, "GET", "/v1/sandboxes", "", "", nil); code != 401 || eb.Code != errdefs.CodeUnauthenticated {
		t.Errorf("no key = %d %+v", code, eb)
	}
	if code, eb := e.call(t, "GET", "/v1/sandboxes", "e2b_0123", "", nil); code != 401 {
		t.Errorf("bad key = %d %+v", code, eb)
	}
	if code, _ := e.call(t, "GET", "/v1/health", "", "", nil); code != 200 {
		t.Errorf("health without a key = %d", code)
	}
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, "", &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.ID, metav1.GetOptions{})
	if err != nil || pod.Labels[LabelOwner] != "alice" {
		t.Errorf("pod owner = %v, %v", pod.Labels, err)
	}
	var list types.SandboxList
	if code, _ := e.call(t, "GET", "/v1/sandboxes", keyBob, "", &list); code != 200 || len(list.Sandboxes) != 0 {
		t.Errorf("bob's list = %+v", list)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if code, eb := e.call(t, m, "/v1/sandboxes/"+sb.ID, keyBob, "", nil); code != 404 || eb.Code != errdefs.CodeNotFound {
			t.Errorf("bob %s alice's = %d %+v", m, code, eb)
		}
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/agent/files", keyBob, "x", nil); code != 404 {
		t.Errorf("bob's data plane to alice's = %d %+v", code, eb)
	}
	if code, _ := e.call(t, "GET", "/v1/sandboxes", keyAlice, "", &list); code != 200 || len(list.Sandboxes) != 1 {
		t.Errorf("alice's list = %+v", list)
	}
	if code, eb := e.call(t, "DELETE", "/v1/sandboxes/"+sb.ID, keyAlice, "", nil); code != 204 {
		t.Errorf("alice's delete = %d %+v", code, eb)
	}
}

// TestRequestsSeeAnotherReplica: a sandbox another replica made, or saw
// run, a moment ago is served at once though this replica's cache has
// not brought the change yet (a client creates through one replica and
// reads through the next). The cache is made to trail on purpose: the
// pod taken out of it, then put back as its node first reported it.
func TestRequestsSeeAnotherReplica(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, "", &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	e2bSb := e.e2bCreate(t, keyAlice, `{"templateID":"minimal"}`)
	exec := func(id, key string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "POST", e.url+"/v1/sandboxes/"+id+"/agent/process.Process/Start", strings.NewReader("payload"))
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && string(body) != "payload" {
			t.Errorf("exec in %s: the node answered %q", id, body)
		}
		return resp.StatusCode
	}
	cached := map[string]*corev1.Pod{}
	for _, id := range []string{sb.ID, e2bSb.SandboxID} {
		pod, err := e.g.podByID(id)
		if err != nil {
			t.Fatal(err)
		}
		cached[id] = pod
		if err := e.g.podIndex.Delete(pod); err != nil {
			t.Fatal(err)
		}
		if _, err := e.g.podByID(id); !apierrors.IsNotFound(err) {
			t.Fatalf("the cache still has %s: %v", id, err)
		}
	}
	if code := exec(sb.ID, keyAlice); code != 200 {
		t.Errorf("exec in a sandbox the cache has not seen = %d, want 200", code)
	}
	// A read asks the API server once, not again for the state it has
	// just read.
	podGets := func() int {
		n := 0
		for _, a := range e.kube.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
				n++
			}
		}
		e.kube.ClearActions()
		return n
	}
	podGets()
	var got types.Sandbox
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID, keyAlice, "", &got); code != 200 || got.State != types.StateReady {
		t.Errorf("GET a sandbox the cache has not seen = %d %+v %+v, want ready", code, eb, got)
	}
	if n := podGets(); n != 1 {
		t.Errorf("GET a sandbox the cache has not seen read its pod %d times, want 1", n)
	}
	if code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2bSb.SandboxID, keyAlice, "", nil); code != 200 {
		t.Errorf("E2B getInfo of a sandbox the cache has not seen = %d %s", code, data)
	}
	if n := podGets(); n != 1 {
		t.Errorf("E2B getInfo of a sandbox the cache has not seen read its pod %d times, want 1", n)
	}
	// Read from the API server, the sandbox is still its owner's alone;
	// an ID nobody made is still not found.
	if code := exec(sb.ID, keyBob); code != 404 {
		t.Errorf("another key's exec = %d, want 404", code)
	}
	if code, _, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2bSb.SandboxID, keyBob, "", nil); code != 404 {
		t.Errorf("another key's E2B getInfo = %d, want 404", code)
	}
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+strings.Repeat("a", len(sb.ID)), keyAlice, "", nil); code != 404 || eb.Code != errdefs.CodeNotFound {
		t.Errorf("GET an ID nobody made = %d %+v, want not_found", code, eb)
	}
	// Back in the cache as its node first reported it: Pending, no
	// sandbox on the node yet.
	for id, pod := range cached {
		stale := pod.DeepCopy()
		stale.Status = corev1.PodStatus{Phase: corev1.PodPending}
		if err := e.g.podIndex.Add(stale); err != nil {
			t.Fatal(err)
		}
		if p, _ := e.g.podByID(id); state(p) != types.StateCreating {
			t.Fatalf("the cache says %s is %s, want it made to trail (creating)", id, state(p))
		}
	}
	if code := exec(sb.ID, keyAlice); code != 200 {
		t.Errorf("exec in a sandbox the cache shows creating = %d, want 200", code)
	}
	if code := exec(e2bSb.SandboxID, keyAlice); code != 200 {
		t.Errorf("exec in an E2B sandbox the cache shows creating = %d, want 200", code)
	}
	podGets()
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID, keyAlice, "", &got); code != 200 || got.State != types.StateReady {
		t.Errorf("GET a sandbox the cache shows creating = %d %+v %+v, want ready", code, eb, got)
	}
	if code, data, _ := e.e2bCall(t, "GET", "/sandboxes/"+e2bSb.SandboxID, keyAlice, "", nil); code != 200 {
		t.Errorf("E2B getInfo of a sandbox the cache shows creating = %d %s", code, data)
	}
	if n := podGets(); n != 2 {
		t.Errorf("two reads of sandboxes the cache shows creating read their pods %d times, want 2", n)
	}
}

// TestDataPlane: the agent routes reach the sandbox's node over mutual
// TLS with the node's sandbox ID; the caller's key stays at the gateway.
func TestDataPlane(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, "", &sb); code != 201 {
		t.Fatalf("create = %d %+v", code, eb)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", e.url+"/v1/sandboxes/"+sb.ID+"/agent/process.Process/Start", bytes.NewReader([]byte("payload")))
	req.Header.Set("X-API-Key", keyAlice)
	req.Header.Set("Authorization", "Basic cm9vdDo=")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "payload" {
		t.Fatalf("proxied = %d %q", resp.StatusCode, body)
	}
	if p := resp.Header.Get("X-Got-Path"); !strings.HasPrefix(p, node.DataPlanePrefix+"/v1/sandboxes/"+nodeSbPref) || !strings.HasSuffix(p, "/agent/process.Process/Start") {
		t.Errorf("node saw path %q", p)
	}
	if k, a := resp.Header.Get("X-Got-Key"), resp.Header.Get("X-Got-Auth"); k != "" || a != "Basic cm9vdDo=" {
		t.Errorf("node saw key %q, authorization %q", k, a)
	}

	// The review routes go to the same node, query and all; another key
	// does not reach them.
	for _, rt := range node.ReviewRoutes {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", e.url+"/v1/sandboxes/"+sb.ID+"/"+rt+"?follow=1", nil)
		req.Header.Set("X-API-Key", keyAlice)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		p := resp.Header.Get("X-Got-Path")
		if resp.StatusCode != 200 || !strings.HasPrefix(p, node.DataPlanePrefix+"/v1/sandboxes/"+nodeSbPref) || !strings.HasSuffix(p, "/"+rt) || resp.Header.Get("X-Got-Query") != "follow=1" {
			t.Errorf("GET %s = %d, node saw %q ? %q", rt, resp.StatusCode, p, resp.Header.Get("X-Got-Query"))
		}
		if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/"+rt, keyBob, "", nil); code != 404 || eb.Code != errdefs.CodeNotFound {
			t.Errorf("bob's GET %s = %d %+v, want not_found", rt, code, eb)
		}
	}

	// A port of the sandbox: through the node's ports route, with the
	// client's Host and without the key.
	req, _ = http.NewRequestWithContext(t.Context(), "GET", e.url+"/v1/sandboxes/"+sb.ID+"/ports/8080/app/index.html?x=1", nil)
	req.Header.Set("X-API-Key", keyAlice)
	req.Host = "app.example"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if p, h := resp.Header.Get("X-Got-Path"), resp.Header.Get("X-Got-Host"); resp.StatusCode != 200 || !strings.HasSuffix(p, "/ports/8080/app/index.html") ||
		h != "app.example" || resp.Header.Get("X-Got-Key") != "" || resp.Header.Get("X-Got-Query") != "x=1" {
		t.Errorf("GET a port = %d, node saw %q (Host %q, key %q)", resp.StatusCode, p, h, resp.Header.Get("X-Got-Key"))
	}
	if code, eb := e.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8080/", keyBob, "", nil); code != 404 || eb.Code != errdefs.CodeNotFound {
		t.Errorf("bob's GET of a port = %d %+v, want not_found", code, eb)
	}
}

// TestNotServed: routes of the daemon the gateway does not serve answer
// not_implemented, never not_found.
func TestNotServed(t *testing.T) {
	e := startGateway(t, false)
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/keys"},
		{"POST", "/v1/apikeys"},
		{"POST", "/v1/workspaces"},
	} {
		if code, eb := e.call(t, r.method, r.path, "", "", nil); code != 501 || eb.Code != errdefs.CodeNotImplemented {
			t.Errorf("%s %s = %d %+v, want 501 not_implemented", r.method, r.path, code, eb)
		}
	}
}

func TestLoadKeysRefused(t *testing.T) {
	good := auth.HashKey(keyAlice)
	for name, body := range map[string]string{
		"bad id":      "keys:\n  - {id: Alice_1, sha256: " + good + "}\n",
		"same id":     "keys:\n  - {id: a, sha256: " + good + "}\n  - {id: a, sha256: " + auth.HashKey(keyBob) + "}\n",
		"short hash":  "keys:\n  - {id: a, sha256: abcd}\n",
		"not hex":     "keys:\n  - {id: a, sha256: " + strings.Repeat("z", 64) + "}\n",
		"unknown key": "keys:\n  - {id: a, sha256: " + good + ", secret: x}\n",
		"bad quota":   "keys:\n  - {id: a, sha256: " + good + ", quota: {max_memory: lots}}\n",
		"neg quota":   "keys:\n  - {id: a, sha256: " + good + ", quota: {max_sandboxes: -1}}\n",
		"quota field": "keys:\n  - {id: a, sha256: " + good + ", quota: {max_disk: 1G}}\n",
	} {
		if _, err := LoadKeys(writeFile(t, "keys.yaml", []byte(body))); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: LoadKeys = %v, want invalid argument", name, err)
		}
	}
	ks, err := LoadKeys(writeFile(t, "keys.yaml", []byte("keys:\n  - {id: a, sha256: "+strings.ToUpper(good)+", admin: true}\n")))
	if err != nil {
		t.Fatal(err)
	}
	if k, err := ks.Verify(t.Context(), keyAlice); err != nil || k.ID != "a" || !k.Admin {
		t.Errorf("Verify = %+v, %v", k, err)
	}
	for _, s := range []string{"", keyBob, "nope"} {
		if _, err := ks.Verify(t.Context(), s); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Verify(%q) = %v, want unauthenticated", s, err)
		}
	}
}

// TestCreateAbandoned: a caller that gives up on a create leaves no pod
// behind.
func TestCreateAbandoned(t *testing.T) {
	e := startGateway(t, false)
	// The watch (and so each loop over it) ends after a bound.
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	w, err := e.kube.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/sandboxes", strings.NewReader(`{"template":"`+tplHangs+`"}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	// next is the watch's next event; the fake's watch ignores its
	// context, so the bound is kept here.
	next := func() (watch.Event, bool) {
		select {
		case ev, ok := <-w.ResultChan():
			return ev, ok
		case <-wctx.Done():
			return watch.Event{}, false
		}
	}
	var name string
	for ev, ok := next(); ok; ev, ok = next() {
		if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added {
			name = p.Name
			break
		}
	}
	if name == "" {
		t.Fatal("no pod was made")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned create = %v", err)
	}
	for ev, ok := next(); ok; ev, ok = next() {
		if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Deleted && p.Name == name {
			return
		}
	}
	t.Errorf("pod %s of the abandoned create was not deleted", name)
}

// TestSetTimeout: POST …/timeout moves the deadline annotation (the node
// follows it) and answers the sandbox with its new deadline; bad input
// names its field and changes nothing; another key's sandbox is not found.
func TestSetTimeout(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"timeout":"1m","on_node_lost":"recreate"}`, &sb); code != http.StatusCreated {
		t.Fatalf("create = %d %+v", code, eb)
	}
	pods := e.kube.CoreV1().Pods(ns)
	before, err := pods.Get(t.Context(), sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if before.Annotations[AnnotationOnNodeLost] != types.OnNodeLostRecreate {
		t.Errorf("on-node-lost annotation = %q", before.Annotations[AnnotationOnNodeLost])
	}
	var got types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/timeout", keyAlice, `{"timeout":"2h"}`, &got); code != 200 {
		t.Fatalf("set timeout = %d %+v", code, eb)
	}
	after, err := pods.Get(t.Context(), sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := time.Parse(time.RFC3339, after.Annotations[node.AnnotationDeadline])
	if err != nil || !dl.Equal(got.Deadline) || !got.Deadline.After(sb.Deadline.Add(time.Hour)) || got.State != types.StateReady {
		t.Errorf("after set timeout: annotation %q (%v), answer %+v; created with deadline %v", after.Annotations[node.AnnotationDeadline], err, got, sb.Deadline)
	}
	for _, tc := range []struct {
		id, key, body string
		status        int
		code, field   string
	}{
		{sb.ID, keyAlice, `{}`, 400, errdefs.CodeInvalidArgument, "timeout"},
		{sb.ID, keyAlice, `{"timeout":"soon"}`, 400, errdefs.CodeInvalidArgument, "timeout"},
		{sb.ID, keyAlice, `{"timeout":"0s"}`, 400, errdefs.CodeInvalidArgument, "timeout"},
		{sb.ID, keyAlice, `{"timeout":"25h"}`, 400, errdefs.CodeInvalidArgument, "timeout"},
		{sb.ID, keyAlice, `{"timeout":"1m","x":1}`, 400, errdefs.CodeInvalidArgument, "body"},
		{sb.ID, keyBob, `{"timeout":"1m"}`, 404, errdefs.CodeNotFound, ""},
		{"nosuchsandbox", keyAlice, `{"timeout":"1m"}`, 404, errdefs.CodeNotFound, ""},
	} {
		code, eb := e.call(t, "POST", "/v1/sandboxes/"+tc.id+"/timeout", tc.key, tc.body, nil)
		if code != tc.status || eb.Code != tc.code || eb.Field != tc.field {
			t.Errorf("timeout %s %s = %d %+v, want %d %s on %q", tc.id, tc.body, code, eb, tc.status, tc.code, tc.field)
		}
	}
	if again, err := pods.Get(t.Context(), sb.ID, metav1.GetOptions{}); err != nil || again.Annotations[node.AnnotationDeadline] != after.Annotations[node.AnnotationDeadline] {
		t.Errorf("refused requests moved the deadline: %v, %v", again.Annotations, err)
	}
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"on_node_lost":"migrate"}`, nil); code != 400 || eb.Field != "on_node_lost" {
		t.Errorf("create with on_node_lost migrate = %d %+v", code, eb)
	}
}

// TestQuota: a key's quota bounds its live sandboxes (count, memory) and
// each one's timeout; a create over it is refused with resource_exhausted
// and leaves no pod; other keys are not bounded by it; a sandbox made by
// another replica (straight in the API server) counts.
func TestQuota(t *testing.T) {
	e := startGateway(t, true)
	var sb types.Sandbox
	if st, body := e.call(t, "POST", "/v1/sandboxes", keyCarol, `{"memory":"128M"}`, &sb); st != http.StatusCreated {
		t.Fatalf("first create = %d %+v", st, body)
	}
	for _, tc := range []struct{ name, body, field string }{
		{"memory", `{"memory":"512M"}`, ""},
		{"timeout", `{"memory":"128M","timeout":"2h"}`, "timeout"},
	} {
		before := e.podNames(t)
		st, body := e.call(t, "POST", "/v1/sandboxes", keyCarol, tc.body, nil)
		if st != http.StatusTooManyRequests || body.Code != errdefs.CodeResourceExhausted || body.Field != tc.field || !strings.Contains(body.Message, "quota max-") {
			t.Errorf("%s over the quota = %d %+v", tc.name, st, body)
		}
		if after := e.podNames(t); len(after) != len(before) {
			t.Errorf("%s: refused create left pods: %v → %v", tc.name, before, after)
		}
	}
	if st, body := e.call(t, "POST", "/v1/sandboxes/"+sb.ID+"/timeout", keyCarol, `{"timeout":"2h"}`, nil); st != http.StatusTooManyRequests || body.Field != "timeout" {
		t.Errorf("timeout past the quota = %d %+v", st, body)
	}
	// Another replica's sandbox of carol's fills the second place.
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "othereplica000000001", Namespace: ns,
		Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwner: "carol"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "minimal"}}}}
	if _, err := e.kube.CoreV1().Pods(ns).Create(t.Context(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.podNames(t)
	if st, body := e.call(t, "POST", "/v1/sandboxes", keyCarol, `{"memory":"128M"}`, nil); st != http.StatusTooManyRequests || !strings.Contains(body.Message, "max-sandboxes 2") {
		t.Errorf("third sandbox = %d %+v", st, body)
	}
	if after := e.podNames(t); len(after) != len(before) {
		t.Errorf("refused create left pods: %v → %v", before, after)
	}
	// Other keys are not bound by carol's quota.
	if st, body := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"memory":"512M","timeout":"2h"}`, nil); st != http.StatusCreated {
		t.Errorf("alice's create = %d %+v", st, body)
	}
}

// TestSetNetwork: PUT …/network writes the normalized policy to the pod's
// network annotation and answers once the node reports it applied; a bad
// entry is named and changes nothing; a policy the node's daemon refuses
// answers its error and the annotation goes back to the policy the
// sandbox holds; another key's sandbox is not found.
func TestSetNetwork(t *testing.T) {
	e := startGateway(t, true)
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"network":{"mode":"allow","allow":["a b"]}}`, nil); code != 400 || eb.Field != "network.allow[0]" {
		t.Errorf("create with a bad policy = %d %+v, want 400 naming network.allow[0]", code, eb)
	}
	var sb types.Sandbox
	if code, eb := e.call(t, "POST", "/v1/sandboxes", keyAlice, `{"network":{"mode":"allow","allow":["pypi.org"]}}`, &sb); code != http.StatusCreated {
		t.Fatalf("create = %d %+v", code, eb)
	}
	annotation := func() string {
		t.Helper()
		pod, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod.Annotations[node.AnnotationNetwork]
	}
	var got types.NetworkPolicy
	if code, eb := e.call(t, "PUT", "/v1/sandboxes/"+sb.ID+"/network", keyAlice, `{"mode":"allow","allow":["Example.COM"],"http":[{"host":"api.example.com","methods":["get"],"path":"/v1/"}]}`, &got); code != 200 {
		t.Fatalf("put network = %d %+v", code, eb)
	}
	want := `{"mode":"allow","allow":["example.com"],"http":[{"host":"api.example.com","methods":["GET"],"path":"/v1/"}]}`
	if a := annotation(); a != want || got.Mode != "allow" || !slices.Equal(got.Allow, []string{"example.com"}) {
		t.Errorf("after put: annotation %s, answer %+v; want %s", a, got, want)
	}
	for _, tc := range []struct {
		id, key, body string
		status        int
		code, field   string
	}{
		{sb.ID, keyAlice, `{"mode":"allow","allow":["ok.example","bad entry"]}`, 400, errdefs.CodeInvalidArgument, "allow[1]"},
		{sb.ID, keyAlice, `{"mode":"sometimes"}`, 400, errdefs.CodeInvalidArgument, "mode"},
		{sb.ID, keyAlice, `{"mode":"open","x":1}`, 400, errdefs.CodeInvalidArgument, "body"},
		{sb.ID, keyAlice, `{"mode":"allow","allow":["refused.example"]}`, 403, errdefs.CodePermissionDenied, ""},
		{sb.ID, keyBob, `{"mode":"open"}`, 404, errdefs.CodeNotFound, ""},
		{"nosuchsandbox", keyAlice, `{"mode":"open"}`, 404, errdefs.CodeNotFound, ""},
	} {
		code, eb := e.call(t, "PUT", "/v1/sandboxes/"+tc.id+"/network", tc.key, tc.body, nil)
		if code != tc.status || eb.Code != tc.code || eb.Field != tc.field {
			t.Errorf("put network %s %s = %d %+v, want %d %s on %q", tc.id, tc.body, code, eb, tc.status, tc.code, tc.field)
		}
		if a := annotation(); a != want {
			t.Errorf("after refused put %s: annotation %s, want %s", tc.body, a, want)
		}
	}
	// The policy the sandbox holds, written again, answers at once.
	if code, eb := e.call(t, "PUT", "/v1/sandboxes/"+sb.ID+"/network", keyAlice, want, nil); code != 200 {
		t.Errorf("put the same policy = %d %+v", code, eb)
	}
}
