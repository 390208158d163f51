//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/daemon"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/internal/meminfo"
)

// newNodeCmd runs the daemon and registers the host as a Kubernetes node
// whose pods are Berth sandboxes.
func newNodeCmd() *cobra.Command {
	var (
		o          serveOptions
		kubeconfig string
		name       string
		ip         string
		listen     string
		cert, key  string
		clientCA   string
		maxPods    int
		reserveCPU string
		reserveMem string
		backOff    time.Duration
		backOffMax time.Duration
		configSync time.Duration
		apiQPS     float64
		apiBurst   int
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the Berth daemon as a Kubernetes node (as root)",
		Long: `Run the Berth daemon (every flag of serve applies) and register this host as a
Kubernetes node through --kubeconfig. Pods the scheduler binds to the node run
as Berth sandboxes: one sandbox per pod, each container a process in it.

The node is tainted ` + node.TaintKey + `=true:NoSchedule: only pods that
tolerate it land there. A pod chooses its sandbox with annotations:
  ` + node.AnnotationTemplate + `   template (default: the first image's name without registry or tag)
  ` + node.AnnotationIsolation + `  runc or gvisor
  ` + node.AnnotationNetwork + `    none (default), open, or a JSON network policy
  ` + node.AnnotationEnv + `        the sandbox's environment, a JSON object of strings
  ` + node.AnnotationUser + `       account processes run as when a request names none
  ` + node.AnnotationAllowSudo + ` true: sudo inside the sandbox's user namespace
Resource limits (or requests) of the containers bound the sandbox's CPU and
memory.

The kubelet API (logs, exec) is served on --kubelet-listen over TLS to
clients whose certificate --client-ca signed: the API server's
--kubelet-client-certificate. The same server carries the data plane of the
node's pods' sandboxes under /berth/ for the gateway (berth serve --kubernetes),
whose client certificate --client-ca must sign too. Pods keep running across a
restart of the node.

Containers restart as the pod's restartPolicy says (Always, the default;
OnFailure; Never), with the kubelet's back-off: at once, then
--restart-backoff doubling up to --restart-backoff-max. configMap and secret
volumes follow their objects every --config-sync-period.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kubeconfig == "" || cert == "" || key == "" || clientCA == "" {
				return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "kubeconfig",
					Message: "berth node needs --kubeconfig, --tls-cert, --tls-key and --client-ca"}
			}
			if backOff <= 0 || backOffMax < backOff {
				return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "restart-backoff",
					Message: "--restart-backoff must be positive and at most --restart-backoff-max"}
			}
			if configSync < time.Second {
				return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "config-sync-period",
					Message: "--config-sync-period must be at least 1s"}
			}
			if err := checkAPIRate(apiQPS, apiBurst); err != nil {
				return err
			}
			cfg, log, ctx, done, err := o.setup(cmd, "berth node")
			if err != nil {
				return err
			}
			defer done()
			cfg = cfg.WithDefaults()
			if name == "" {
				if name, err = os.Hostname(); err != nil {
					return err
				}
			}
			rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("--kubeconfig: %w", err)
			}
			// client-go's own default (5/s, bursts of 10) would hold a
			// node to about one pod lifecycle a second (docs/scale.md).
			rc.QPS, rc.Burst = float32(apiQPS), apiBurst
			kube, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("--kubeconfig: %w", err)
			}
			capacity, err := hostCapacity(cfg, maxPods)
			if err != nil {
				return err
			}
			reserved := corev1.ResourceList{}
			for res, v := range map[corev1.ResourceName]string{corev1.ResourceCPU: reserveCPU, corev1.ResourceMemory: reserveMem} {
				q, err := resource.ParseQuantity(v)
				if err != nil {
					return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "reserve-" + string(res),
						Message: fmt.Sprintf("--reserve-%s %q: %v", res, v, err)}
				}
				reserved[res] = q
			}

			// The daemon runs under its own context, ended after the node
			// stopped, so the node never talks to a daemon half gone.
			dctx, dcancel := context.WithCancel(context.WithoutCancel(ctx))
			defer dcancel()
			derr := make(chan error, 1)
			go func() { derr <- daemon.Run(dctx, cfg, log.With("component", "daemon")) }()
			c, err := client.New("unix://" + daemon.SocketPath(cfg.DataDir))
			if err != nil {
				return err
			}
			if err := waitDaemon(ctx, c, derr); err != nil {
				dcancel()
				return err
			}
			nerr := node.Run(ctx, node.Config{
				Name: name, IP: ip, Listen: listen,
				TLSCert: cert, TLSKey: key, ClientCA: clientCA,
				Kube: kube, Capacity: capacity, Reserved: reserved,
				DaemonSocket:   daemon.SocketPath(cfg.DataDir),
				RestartBackOff: backOff, RestartBackOffMax: backOffMax,
				ConfigSyncPeriod: configSync,
				Version:          buildVersion(), Logger: log.With("component", "node"),
			}, node.FromClient(c))
			dcancel()
			return errors.Join(nerr, <-derr)
		},
	}
	o.bind(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to join")
	f.StringVar(&name, "node-name", "", "the node's name (default: the host name)")
	f.StringVar(&ip, "node-ip", "", "the address the API server reaches the kubelet API at (default: --kubelet-listen's host)")
	f.StringVar(&listen, "kubelet-listen", "127.0.0.1:10250", "address of the kubelet API (logs, exec)")
	f.StringVar(&cert, "tls-cert", "", "kubelet API serving certificate (PEM)")
	f.StringVar(&key, "tls-key", "", "kubelet API serving key (PEM)")
	f.StringVar(&clientCA, "client-ca", "", "CA (PEM) whose client certificates the kubelet API accepts")
	f.IntVar(&maxPods, "max-pods", 0, "pods the node takes (default: host memory / the default sandbox memory)")
	f.StringVar(&reserveCPU, "reserve-cpu", "0", "CPU held back from the node's allocatable for the host")
	f.StringVar(&reserveMem, "reserve-memory", "512Mi", "memory held back from the node's allocatable for the host")
	f.DurationVar(&backOff, "restart-backoff", node.DefaultRestartBackOff, "wait before the second restart of a container that keeps exiting (doubled for each next one)")
	f.DurationVar(&backOffMax, "restart-backoff-max", node.DefaultRestartBackOffMax, "longest wait before restarting a container")
	f.DurationVar(&configSync, "config-sync-period", node.DefaultConfigSyncPeriod, "how often configMap and secret volumes are brought up to date with their objects")
	f.Float64Var(&apiQPS, "kube-api-qps", defaultKubeAPIQPS, "requests per second the node sends the API server at most (as the kubelet's --kube-api-qps)")
	f.IntVar(&apiBurst, "kube-api-burst", defaultKubeAPIBurst, "requests the node may send the API server at once above --kube-api-qps (as the kubelet's --kube-api-burst)")
	return cmd
}

// The node's API request rate by default: the kubelet's defaults.
const (
	defaultKubeAPIQPS   = 50
	defaultKubeAPIBurst = 100
)

// checkAPIRate checks --kube-api-qps and --kube-api-burst: a positive rate
// and a burst of at least one request.
func checkAPIRate(qps float64, burst int) error {
	if qps <= 0 || qps > 1e6 {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "kube-api-qps",
			Message: fmt.Sprintf("--kube-api-qps %v: want a rate above 0 and at most 1000000", qps)}
	}
	if burst < 1 {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "kube-api-burst",
			Message: fmt.Sprintf("--kube-api-burst %d: want at least 1", burst)}
	}
	return nil
}

// waitDaemon waits until the daemon answers on its socket, or fails.
func waitDaemon(ctx context.Context, c *client.Client, derr <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := c.Health(ctx); err == nil {
			return nil
		}
		select {
		case err := <-derr:
			return fmt.Errorf("daemon: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("daemon did not answer: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// hostCapacity is what the node offers: the host's CPUs and memory, the
// data dir's disk, and as many pods as fit the host's memory at the
// daemon's default sandbox size (or maxPods).
func hostCapacity(cfg daemon.Config, maxPods int) (corev1.ResourceList, error) {
	mem, err := memTotal()
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.DataDir, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", cfg.DataDir, err)
	}
	disk := int64(st.Blocks) * st.Bsize
	if maxPods <= 0 {
		maxPods = int(max(1, mem/max(1, cfg.Defaults.MemoryBytes)))
	}
	return corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(mem, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(disk, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(int64(maxPods), resource.DecimalSI),
	}, nil
}

func memTotal() (int64, error) {
	info, err := meminfo.Read()
	if err != nil {
		return 0, fmt.Errorf("host memory: %w: %w", err, errdefs.ErrUnavailable)
	}
	return info.Total, nil
}
