package harness

import (
	"slices"
	"time"
)

// Percentile is the p-th percentile of ds (nearest rank), rounded to the
// millisecond; 0 for none. For the opt-in measurements tests report (never
// assert).
func Percentile(ds []time.Duration, p int) time.Duration {
	return Quantile(ds, p).Round(time.Millisecond)
}

// Quantile is the p-th percentile of ds (nearest rank), unrounded; 0 for
// none. The benchmarks and the measurements of sub-millisecond hops use it.
func Quantile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}
