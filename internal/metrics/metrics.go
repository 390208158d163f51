// Package metrics exposes the daemon's Prometheus metrics: sandboxes by
// state, create latency, execs, egress decisions, CPU-seconds per API key,
// and the Go runtime's and process's own collectors. Counters are fed by
// the daemon's wiring (create, the agent transport, the audit log); the
// gauges are read from their sources at scrape time.
package metrics

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berth-sandbox/berth/api/types"
)

// Sources are what the scrape-time metrics read.
type Sources struct {
	// States counts sandbox records by state.
	States func(ctx context.Context) (map[string]int, error)
	// KeyCPU is the CPU-seconds metered per API key name ("" for the
	// operator's sandboxes).
	KeyCPU func(ctx context.Context) (map[string]float64, error)
}

// Metrics is the daemon's registry and its instruments.
type Metrics struct {
	reg     *prometheus.Registry
	create  *prometheus.HistogramVec
	execs   prometheus.Counter
	egress  *prometheus.CounterVec
	scrape  *scrapeCollector
	handler http.Handler
}

// SetSources sets what the scrape-time metrics read; call it before the
// handler serves.
func (m *Metrics) SetSources(src Sources) { m.scrape.src = src }

// New registers every metric.
func New(src Sources) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_sandbox_create_seconds",
			Help:    "Time to create a sandbox, until it is ready (or the create failed), by result.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120},
		}, []string{"result"}),
		execs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "berth_execs_total",
			Help: "Processes started in sandboxes through the daemon's data plane.",
		}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_egress_decisions_total",
			Help: "Egress policy decisions (connections, requests, DNS queries), by decision.",
		}, []string{"decision"}),
	}
	m.scrape = &scrapeCollector{src: src}
	m.reg.MustRegister(m.create, m.execs, m.egress,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.scrape)
	for _, d := range []string{"allow", "deny"} {
		m.egress.WithLabelValues(d)
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler { return m.handler }

// ObserveCreate records one create's duration and result.
func (m *Metrics) ObserveCreate(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.create.WithLabelValues(result).Observe(d.Seconds())
}

// CountEgress counts one (or n aggregated) egress decisions.
func (m *Metrics) CountEgress(decision string, n int64) {
	if n <= 0 {
		n = 1
	}
	m.egress.WithLabelValues(decision).Add(float64(n))
}

// Transport counts process starts on their way to an agent.
func (m *Metrics) Transport(next http.RoundTripper) http.RoundTripper {
	return execCounter{next: next, m: m}
}

type execCounter struct {
	next http.RoundTripper
	m    *Metrics
}

func (c execCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/process.Process/Start") {
		c.m.execs.Inc()
	}
	return c.next.RoundTrip(r)
}

var (
	sandboxesDesc = prometheus.NewDesc("berth_sandboxes", "Sandbox records by state (ended ones until the retention removes them).", []string{"state"}, nil)
	keyCPUDesc    = prometheus.NewDesc("berth_key_cpu_seconds_total", "CPU-seconds metered for the sandboxes of each API key (key \"\" is the operator's).", []string{"key"}, nil)
)

// scrapeCollector reads its values from the sources at scrape time.
type scrapeCollector struct{ src Sources }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- keyCPUDesc
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c.src.States != nil {
		if n, err := c.src.States(ctx); err == nil {
			for _, st := range types.States {
				ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n[st]), st)
			}
		} else {
			ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		}
	}
	if c.src.KeyCPU != nil {
		if cpu, err := c.src.KeyCPU(ctx); err == nil {
			for k, v := range cpu {
				ch <- prometheus.MustNewConstMetric(keyCPUDesc, prometheus.CounterValue, v, k)
			}
		} else {
			ch <- prometheus.NewInvalidMetric(keyCPUDesc, err)
		}
	}
}
