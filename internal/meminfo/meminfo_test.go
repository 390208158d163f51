package meminfo

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Info
		wantErr bool
	}{
		{in: "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   12288000 kB\n", want: Info{Total: 24576000 << 10, Available: 12288000 << 10}},
		{in: "MemTotal: 4096 kB\nAnonPages:  1024 kB\nMapped: 7 kB\nShmem: 512 kB\n", want: Info{Total: 4096 << 10, Anon: 1024 << 10, Shmem: 512 << 10}},
		{in: "MemTotal: 4096 kB\nShmem: many kB\n", wantErr: true},
		// gVisor and old kernels: no MemAvailable.
		{in: "MemTotal: 2048 kB\nMemFree: 1024 kB\n", want: Info{Total: 2048 << 10}},
		{in: "MemTotal: 2048\n", want: Info{Total: 2048 << 10}},
		{in: "MemFree: 1 kB\n", wantErr: true},
		{in: "MemTotal: lots kB\n", wantErr: true},
		{in: "MemTotal: 1 MB\n", wantErr: true},
		{in: "MemTotal: -1 kB\n", wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := Parse(strings.NewReader(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	if _, err := Parse(strings.NewReader("Cached: 1 kB\n")); !errors.Is(err, ErrNoTotal) {
		t.Errorf("Parse without MemTotal: %v, want ErrNoTotal", err)
	}
}

func TestRead(t *testing.T) {
	info, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if info.Total <= 0 || info.Available > info.Total {
		t.Errorf("Read() = %+v: want a positive total no smaller than available", info)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("MemTotal: 10 kB\nMemAvailable: 5 kB\n")
	f.Add("MemTotal:\n")
	f.Fuzz(func(t *testing.T, s string) {
		info, err := Parse(strings.NewReader(s))
		if err == nil && (info.Total < 0 || info.Available < 0 || info.Anon < 0 || info.Shmem < 0) {
			t.Errorf("Parse(%q) = %+v: negative", s, info)
		}
	})
}
