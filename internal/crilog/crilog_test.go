package crilog

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestCopy(t *testing.T) {
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 890, time.UTC)
	long := strings.Repeat("x", MaxLine+10)
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"lines", "one\ntwo\n", []string{"F one", "F two"}},
		{"empty line", "\n", []string{"F "}},
		{"no final newline", "one\ntwo", []string{"F one", "F two"}},
		{"nothing", "", nil},
		{"long line", long + "\n", []string{"P " + long[:MaxLine], "F " + long[MaxLine:]}},
		{"spaces kept", "a b  c\n", []string{"F a b  c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out, func() time.Time { return t0 })
			if err := w.Copy(Stderr, strings.NewReader(tc.in)); err != nil {
				t.Fatalf("Copy: %v", err)
			}
			var want string
			for _, l := range tc.want {
				want += "2025-03-04T05:06:07.00000089Z stderr " + l + "\n"
			}
			if out.String() != want {
				t.Errorf("Copy(%q) wrote %q, want %q", tc.in, out.String(), want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	for _, r := range []Record{
		{Time: t0, Stream: Stdout, Content: []byte("hello world")},
		{Time: t0, Stream: Stderr, Partial: true, Content: []byte("part ")},
		{Time: t0.Truncate(time.Second), Stream: Stdout, Content: []byte{}},
	} {
		line := r.Append(nil)
		got, err := Parse(line[:len(line)-1])
		if err != nil || !got.Time.Equal(r.Time) || got.Stream != r.Stream || got.Partial != r.Partial || !bytes.Equal(got.Content, r.Content) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", line, got, err, r)
		}
	}
	for _, bad := range []string{"", "plain output", "2025-03-04T05:06:07Z", "2025-03-04T05:06:07Z stdout", "2025-03-04T05:06:07Z stdin F x", "2025-03-04T05:06:07Z stdout X x", "yesterday stdout F x"} {
		if r, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", bad, r)
		}
	}
}

// FuzzParse: any line parses or fails without panicking, and a record
// parsed back from its own encoding is the same record.
func FuzzParse(f *testing.F) {
	f.Add([]byte("2025-03-04T05:06:07.1Z stdout F hello"))
	f.Add([]byte("2025-03-04T05:06:07Z stderr P "))
	f.Add([]byte("not a record"))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Parse(line)
		if err != nil {
			return
		}
		enc := r.Append(nil)
		r2, err := Parse(enc[:len(enc)-1])
		if err != nil || !r2.Time.Equal(r.Time) || r2.Stream != r.Stream || r2.Partial != r.Partial || !bytes.Equal(r2.Content, r.Content) {
			t.Errorf("Parse(%q) = %+v; its encoding %q parses to %+v, %v", line, r, enc, r2, err)
		}
	})
}

func TestParseRun(t *testing.T) {
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	for _, r := range []Run{{Restart: 0, Started: t0}, {Restart: 12, Started: t0.Truncate(time.Second)}} {
		line := r.Append(nil)
		for _, b := range [][]byte{line, line[:len(line)-1]} {
			got, err := ParseRun(b)
			if err != nil || got.Restart != r.Restart || !got.Started.Equal(r.Started) {
				t.Errorf("ParseRun(%q) = %+v, %v; want %+v", b, got, err, r)
			}
		}
	}
	for _, bad := range []string{"", "3", "-1 2025-03-04T05:06:07Z", "+1 2025-03-04T05:06:07Z", "01 2025-03-04T05:06:07Z", "x 2025-03-04T05:06:07Z", "1 yesterday", "1 2025-03-04T05:06:07Z extra"} {
		if r, err := ParseRun([]byte(bad)); err == nil {
			t.Errorf("ParseRun(%q) = %+v, want an error", bad, r)
		}
	}
}

// FuzzParseRun: the sandbox writes run records and the node reads them:
// any input parses or fails without panicking, and what parses encodes
// back to a record that parses the same.
func FuzzParseRun(f *testing.F) {
	f.Add([]byte("0 2025-03-04T05:06:07.1Z\n"))
	f.Add([]byte("7 2025-03-04T05:06:07Z"))
	f.Add([]byte("not a run"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRun(b)
		if err != nil {
			return
		}
		if r.Restart < 0 {
			t.Errorf("ParseRun(%q) = %+v: negative restarts", b, r)
		}
		r2, err := ParseRun(r.Append(nil))
		if err != nil || r2.Restart != r.Restart || !r2.Started.Equal(r.Started) {
			t.Errorf("ParseRun(%q) = %+v; its encoding parses to %+v, %v", b, r, r2, err)
		}
	})
}
