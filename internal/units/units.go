// Package units parses the sizes and durations that users type: "512M",
// "2G", "1.5GiB", "10m". Parsing is strict: anything it does not recognise
// is an error that says what was expected.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

var suffixes = []struct {
	names []string
	mult  float64
}{
	{[]string{"TIB", "TB", "TI", "T"}, 1 << 40},
	{[]string{"GIB", "GB", "GI", "G"}, 1 << 30},
	{[]string{"MIB", "MB", "MI", "M"}, 1 << 20},
	{[]string{"KIB", "KB", "KI", "K"}, 1 << 10},
	{[]string{"B", ""}, 1},
}

// ParseSize parses a byte size: a non-negative number with an optional
// binary suffix (K, M, G, T, with optional i/iB/B; all are powers of 1024).
func ParseSize(s string) (int64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, fmt.Errorf("empty size: %w", errdefs.ErrInvalidArgument)
	}
	up := strings.ToUpper(in)
	for _, suf := range suffixes {
		for _, name := range suf.names {
			if !strings.HasSuffix(up, name) {
				continue
			}
			num := strings.TrimSpace(up[:len(up)-len(name)])
			if num == "" || strings.ContainsAny(num, "+-eEpPxX_") || strings.HasPrefix(num, ".") && len(num) == 1 {
				continue
			}
			f, err := strconv.ParseFloat(num, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
				continue
			}
			v := f * suf.mult
			if v >= math.MaxInt64 {
				return 0, fmt.Errorf("size %q is too large: %w", s, errdefs.ErrInvalidArgument)
			}
			return int64(v), nil
		}
	}
	return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix (e.g. 512M): %w", s, errdefs.ErrInvalidArgument)
}

// FormatSize renders n bytes with the largest exact binary suffix.
func FormatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseDuration parses a Go duration ("90s", "10m", "1h30m") or a plain
// number of seconds. Negative durations are refused.
func ParseDuration(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	if n, err := strconv.ParseInt(in, 10, 64); err == nil {
		if n < 0 || n > math.MaxInt64/int64(time.Second) {
			return 0, fmt.Errorf("duration %q is out of range: %w", s, errdefs.ErrInvalidArgument)
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(in)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want e.g. 90s, 10m or 1h30m: %w", s, errdefs.ErrInvalidArgument)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q is negative: %w", s, errdefs.ErrInvalidArgument)
	}
	return d, nil
}
