// Package node makes a Berth host a Kubernetes node through the
// virtual-kubelet library: it registers the node (capacity, a taint that
// keeps all but sandbox pods away, conditions from the daemon's health,
// lease heartbeats), runs the pods Kubernetes binds to it as Berth
// sandboxes, and serves the kubelet API (logs, exec) on TLS. It reaches
// the daemon only through the Sandboxes interface.
package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// Config is a Berth node's settings.
type Config struct {
	// Name is the node's name in Kubernetes.
	Name string
	// IP is the address the API server reaches the kubelet API at (the
	// node's InternalIP); Listen is where that API listens (host:port).
	IP     string
	Listen string
	// TLSCert and TLSKey (PEM files) are the kubelet API's serving
	// certificate; ClientCA (PEM) signs the certificates of the clients
	// it accepts (the API server's --kubelet-client-certificate).
	TLSCert, TLSKey, ClientCA string
	// Kube is the client of the cluster's API.
	Kube kubernetes.Interface
	// DaemonSocket, when set, is the daemon's local socket: the kubelet
	// API's server then also carries the gateway's data plane to it under
	// DataPlanePrefix (dataplane.go).
	DaemonSocket string
	// Resources are the node's capacity: cpu, memory, pods, and
	// ephemeral-storage; Reserved is held back from it for the host
	// (allocatable = capacity − reserved).
	Capacity corev1.ResourceList
	Reserved corev1.ResourceList
	// Version is Berth's, shown as the node's kubelet version suffix.
	Version string
	// HealthEvery is how often the daemon's health is checked for the
	// node's conditions (default 10s).
	HealthEvery time.Duration
	// RestartBackOff and RestartBackOffMax are the first wait before
	// restarting a container that keeps exiting and the longest
	// (default DefaultRestartBackOff and DefaultRestartBackOffMax, the
	// kubelet's).
	RestartBackOff, RestartBackOffMax time.Duration
	// ConfigSyncPeriod is how often configMap and secret volumes are
	// brought up to date (DefaultConfigSyncPeriod when zero).
	ConfigSyncPeriod time.Duration
	Logger           *slog.Logger
}

// Run registers the node and serves it until ctx ends. Pods left running
// by a previous run are taken back first.
func Run(ctx context.Context, cfg Config, sb Sandboxes) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HealthEvery == 0 {
		cfg.HealthEvery = 10 * time.Second
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("kubelet listen %q: %w", cfg.Listen, errdefs.ErrInvalidArgument)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 {
		return fmt.Errorf("kubelet listen %q: want a fixed port: %w", cfg.Listen, errdefs.ErrInvalidArgument)
	}
	if cfg.IP == "" {
		cfg.IP = host
	}
	if net.ParseIP(cfg.IP) == nil {
		return fmt.Errorf("node ip %q: want an address: %w", cfg.IP, errdefs.ErrInvalidArgument)
	}
	tlsCfg, err := serverTLS(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spec := nodeSpec(cfg, port)
	pods := newPods(ctx, cfg.Name, cfg.IP, sb, cfg.Kube, newBackOff(cfg.RestartBackOff, cfg.RestartBackOffMax), cfg.Logger)
	pods.syncEvery = cmp.Or(cfg.ConfigSyncPeriod, DefaultConfigSyncPeriod)
	pods.alloc = corev1.ResourceList{}
	for _, r := range roomResources {
		if q, ok := spec.Status.Allocatable[r]; ok {
			pods.alloc[r] = q.DeepCopy()
		}
	}
	defer pods.Wait()
	defer cancel()
	if err := pods.reconcile(ctx); err != nil {
		return err
	}
	status := &nodeStatus{sb: sb, log: cfg.Logger, base: spec.DeepCopy(), poke: make(chan struct{}, 1), room: pods.pausedRoom}
	pods.mu.Lock()
	pods.onRoom = status.refresh
	pods.mu.Unlock()
	pods.wg.Add(1)
	go func() {
		defer pods.wg.Done()
		pods.roomLoop()
	}()
	// The node registers with the templates its daemon has, so the
	// gateway refuses an unknown one before it makes a pod; and with the
	// room its paused pods give back.
	status.lastRoom = status.room()
	if tpls, err := status.templates(ctx); err == nil {
		status.tpls = tpls
		spec.Annotations = tpls.annotations()
		status.base.Annotations = tpls.annotations()
	}
	spec.Status.Allocatable = status.allocatable(status.tpls.warm, status.lastRoom)
	mux := http.NewServeMux()
	if cfg.DaemonSocket != "" {
		handleDataPlane(mux, cfg.DaemonSocket, pods.ownsSandbox, cfg.Logger)
		handleSnapshots(mux, cfg.DaemonSocket, cfg.Name, pods, status.refresh, cfg.Logger)
	}
	n, err := nodeutil.NewNode(cfg.Name, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, vknode.NodeProvider, error) {
		pods.services = pc.Services
		return provider{pods}, status, nil
	},
		nodeutil.WithClient(cfg.Kube),
		nodeutil.AttachProviderRoutes(mux),
		// A pod's status is written alone, never its metadata with it
		// (statusOnlyPods).
		nodeutil.WithPodControllerConfigOverrides(func(pc *vknode.PodControllerConfig) error {
			pc.PodClient = statusOnlyPods{pc.PodClient}
			return nil
		}),
		func(nc *nodeutil.NodeConfig) error {
			nc.NodeSpec = spec
			nc.HTTPListenAddr = cfg.Listen
			nc.Handler = mux
			nc.TLSConfig = tlsCfg
			nc.NumWorkers = max(2, goruntime.NumCPU())
			// The node resolves containers' environment itself, as each
			// starts (env.go): a missing ConfigMap then holds the
			// container with CreateContainerConfigError, where the
			// controller's own resolution would hold the pod without a
			// status, and $(VAR) references keep their order.
			nc.SkipDownwardAPIResolution = true
			return nil
		})
	if err != nil {
		return fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); pods.renew(ctx) }()
	go func() { defer wg.Done(); status.run(ctx, cfg.HealthEvery) }()
	cfg.Logger.Info("node_starting", "node", cfg.Name, "kubelet_listen", cfg.Listen)
	err = n.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serverTLS serves the kubelet API only to clients with a certificate
// ClientCA signed: the API server, for logs and exec.
func serverTLS(cfg Config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("kubelet tls certificate: %w", err)
	}
	pem, err := os.ReadFile(cfg.ClientCA)
	if err != nil {
		return nil, fmt.Errorf("kubelet client ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("kubelet client ca %s: no certificate: %w", cfg.ClientCA, errdefs.ErrInvalidArgument)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, nil
}

// nodeSpec is the node as registered: sandbox-only (tainted), with the
// host's capacity and the kubelet API's endpoint.
func nodeSpec(cfg Config, port int) corev1.Node {
	alloc := corev1.ResourceList{}
	for name, q := range cfg.Capacity {
		a := q.DeepCopy()
		if r, ok := cfg.Reserved[name]; ok {
			a.Sub(r)
			if a.Sign() < 0 {
				a = resource.Quantity{Format: q.Format}
			}
		}
		alloc[name] = a
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.Name,
			Labels: map[string]string{
				"type":                   "virtual-kubelet",
				"kubernetes.io/role":     "agent",
				"kubernetes.io/hostname": cfg.Name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     goruntime.GOARCH,
				TaintKey:                 "true",
			},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: TaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Phase:       corev1.NodeRunning,
			Capacity:    cfg.Capacity,
			Allocatable: alloc,
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: cfg.IP},
				{Type: corev1.NodeHostName, Address: cfg.Name},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem:         "linux",
				Architecture:            goruntime.GOARCH,
				KubeletVersion:          "v1.34.0-berth-" + cfg.Version,
				ContainerRuntimeVersion: "berth://" + cfg.Version,
			},
			Conditions: conditions(nil),
		},
	}
}

// conditions are the node's conditions given the daemon's health (nil
// err: healthy).
func conditions(err error) []corev1.NodeCondition {
	now := metav1.Now()
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "BerthReady",
		Message: "the Berth daemon is healthy", LastHeartbeatTime: now, LastTransitionTime: now}
	if err != nil {
		ready.Status, ready.Reason, ready.Message = corev1.ConditionFalse, "BerthUnhealthy", err.Error()
	}
	out := []corev1.NodeCondition{ready}
	for _, t := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable} {
		out = append(out, corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: "BerthOK", LastHeartbeatTime: now, LastTransitionTime: now})
	}
	return out
}

// nodeStatus is the virtual-kubelet NodeProvider: Ping and the Ready
// condition follow the daemon's health.
type nodeStatus struct {
	sb   Sandboxes
	log  *slog.Logger
	base *corev1.Node

	mu      sync.Mutex
	cb      func(*corev1.Node)
	healthy *bool
	// tpls is what was last reported of the daemon's templates.
	tpls daemonTemplates
	// poke asks run for a check now (refresh).
	poke chan struct{}
	// room is the cpu and memory the node's paused pods give back
	// (room.go); lastRoom what was last reported of it.
	room     func() corev1.ResourceList
	lastRoom corev1.ResourceList
}

// allocatable is the node's allocatable less the pods its warm pools hold,
// plus the room its paused pods give back.
func (s *nodeStatus) allocatable(warm int64, room corev1.ResourceList) corev1.ResourceList {
	return withRoom(withWarm(s.base.Status.Allocatable, warm), room)
}

// refresh has run check the daemon now rather than at its next tick: its
// templates changed through the node's data plane.
func (s *nodeStatus) refresh() {
	select {
	case s.poke <- struct{}{}:
	default: // one is pending already
	}
}

// AnnotationTemplates is the node's annotation naming the templates its
// daemon has (built or buildable), sorted and comma-separated: the
// gateway accepts a create only for a template some Ready node has.
const AnnotationTemplates = "berth.dev/templates"

// AnnotationTemplateBuilds is the node's annotation saying when each
// built template of its daemon was built: `name=<unix seconds>`, sorted
// by name and comma-separated. The gateway's leader finds a node that
// missed a rebuild by it (an older build than the cluster's).
const AnnotationTemplateBuilds = "berth.dev/template-builds"

// AnnotationTemplateBuildIDs is the node's annotation naming the build of
// each built template of its daemon: `name=<build ID>`, sorted by name
// and comma-separated. Copies of one build (an export's imports) share
// it, so the gateway's leader tells a node that missed a rebuild by it,
// with no clocks compared.
const AnnotationTemplateBuildIDs = "berth.dev/template-build-ids"

// daemonTemplates is what the node reports of its daemon's templates.
type daemonTemplates struct {
	// names and builds are the AnnotationTemplates and
	// AnnotationTemplateBuilds values; warm how many sandboxes the warm
	// pools are to hold.
	names, builds, ids string
	warm               int64
}

func (t daemonTemplates) annotations() map[string]string {
	return map[string]string{AnnotationTemplates: t.names, AnnotationTemplateBuilds: t.builds, AnnotationTemplateBuildIDs: t.ids}
}

// templates reads the daemon's templates.
func (s *nodeStatus) templates(ctx context.Context) (daemonTemplates, error) {
	tpls, err := s.sb.Templates(ctx)
	if err != nil {
		return daemonTemplates{}, err
	}
	var out daemonTemplates
	names := make([]string, 0, len(tpls))
	var builds, ids []string
	for _, t := range tpls {
		names = append(names, t.Name)
		if t.Built && !t.BuiltAt.IsZero() {
			builds = append(builds, t.Name+"="+strconv.FormatInt(t.BuiltAt.Unix(), 10))
		}
		if t.Built && t.BuildID != "" {
			ids = append(ids, t.Name+"="+t.BuildID)
		}
		for _, p := range []*client.WarmPool{t.Warm, t.WarmSudo} {
			if p != nil {
				out.warm += int64(p.Target)
			}
		}
	}
	slices.Sort(names)
	slices.Sort(builds)
	out.names = strings.Join(slices.Compact(names), ",")
	out.builds = strings.Join(slices.Compact(builds), ",")
	slices.Sort(ids)
	out.ids = strings.Join(slices.Compact(ids), ",")
	return out, nil
}

// TemplateBuiltAt reads when node n's daemon built template name, from
// its AnnotationTemplateBuilds; ok is false when it does not say.
func TemplateBuiltAt(n *corev1.Node, name string) (at time.Time, ok bool) {
	for _, e := range strings.Split(n.Annotations[AnnotationTemplateBuilds], ",") {
		k, v, found := strings.Cut(e, "=")
		if !found || k != name {
			continue
		}
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		return time.Unix(secs, 0).UTC(), true
	}
	return time.Time{}, false
}

// TemplateBuildID reads which build of template name node n's daemon
// has, from its AnnotationTemplateBuildIDs; ok is false when it does not
// say.
func TemplateBuildID(n *corev1.Node, name string) (id string, ok bool) {
	for _, e := range strings.Split(n.Annotations[AnnotationTemplateBuildIDs], ",") {
		if k, v, found := strings.Cut(e, "="); found && k == name && v != "" {
			return v, true
		}
	}
	return "", false
}

// withWarm is alloc with the pods the daemon's warm pools hold taken
// out: each pool sandbox takes a sandbox's room on the host and is no
// pod, so the scheduler would not count it otherwise.
func withWarm(alloc corev1.ResourceList, warm int64) corev1.ResourceList {
	out := alloc.DeepCopy()
	if p, ok := out[corev1.ResourcePods]; ok && warm > 0 {
		out[corev1.ResourcePods] = *resource.NewQuantity(max(0, p.Value()-warm), resource.DecimalSI)
	}
	return out
}

func (s *nodeStatus) Ping(ctx context.Context) error { return s.check(ctx) }

func (s *nodeStatus) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	s.mu.Lock()
	s.cb = cb
	s.mu.Unlock()
}

func (s *nodeStatus) check(ctx context.Context) error {
	h, err := s.sb.Health(ctx)
	if err == nil && h.Status != "ok" {
		err = fmt.Errorf("daemon health %q: %w", h.Status, errdefs.ErrUnavailable)
	}
	return err
}

// run reports a change of the daemon's health as the node's Ready
// condition, a change of its templates as AnnotationTemplates, a change
// of its warm pools in the allocatable pods, and a change of the room its
// paused pods give back in the allocatable cpu and memory.
func (s *nodeStatus) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		err := s.check(cctx)
		tpls, terr := s.templates(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		var room corev1.ResourceList
		if s.room != nil {
			room = s.room()
		}
		ok := err == nil
		s.mu.Lock()
		if terr != nil {
			tpls = s.tpls
		}
		cb, changed := s.cb, s.healthy == nil || *s.healthy != ok || tpls != s.tpls || !sameRoom(room, s.lastRoom)
		if cb != nil && changed {
			s.healthy, s.tpls, s.lastRoom = &ok, tpls, room
		}
		s.mu.Unlock()
		if cb != nil && changed {
			if !ok {
				s.log.Warn("node_unhealthy", "err", err)
			}
			// The controller takes status, labels and annotations
			// whole from what it is given.
			n := s.base.DeepCopy()
			n.Status.Conditions = conditions(err)
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			maps.Copy(n.Annotations, tpls.annotations())
			n.Status.Allocatable = s.allocatable(tpls.warm, room)
			s.log.Debug("node_status", "ready", ok, "paused_room", roomString(room))
			cb(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.poke:
		}
	}
}

// provider is the virtual-kubelet Provider: Pods, with no stats yet.
type provider struct{ *Pods }

func (provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errors.New("stats summary is not served by Berth nodes yet")
}

func (provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

var _ api.ContainerLogsHandlerFunc = (&Pods{}).GetContainerLogs
