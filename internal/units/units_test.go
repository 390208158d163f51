package units

import (
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"512M", 512 << 20, true},
		{"2G", 2 << 30, true},
		{"2g", 2 << 30, true},
		{"1.5G", 3 << 29, true},
		{"1GiB", 1 << 30, true},
		{"64MB", 64 << 20, true},
		{"1048576", 1 << 20, true},
		{"100B", 100, true},
		{"4Ki", 4096, true},
		{"", 0, false},
		{"-1G", 0, false},
		{"G", 0, false},
		{"1X", 0, false},
		{"1e9", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"99999999999T", 0, false},
		{"0x10", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"10m", 10 * time.Minute, true},
		{"90", 90 * time.Second, true},
		{"1h30m", 90 * time.Minute, true},
		{"-5m", 0, false},
		{"-5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512M", "2G", "1.5GiB", "", "-1", "1e400", "9223372036854775807", "0.0000001K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Errorf("ParseSize(%q) = %d, want non-negative", s, n)
		}
		if err == nil {
			if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
				t.Errorf("round trip of %d via %q = %d, %v", n, FormatSize(n), back, err)
			}
		}
	})
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"10m", "90", "-1s", "1h", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err == nil && d < 0 {
			t.Errorf("ParseDuration(%q) = %v, want non-negative", s, d)
		}
	})
}
