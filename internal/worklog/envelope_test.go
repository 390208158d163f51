package worklog

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

func TestParseEnvelopes(t *testing.T) {
	big := bytes.Repeat([]byte("x"), maxMessage+1)
	tests := []struct {
		name      string
		in        []byte
		wantMsgs  []string
		wantFlags []byte
		wantRest  int
	}{
		{"empty", nil, nil, nil, 0},
		{"one", envelope(0, []byte("abc")), []string{"abc"}, []byte{0}, 0},
		{"two and end", append(append(envelope(0, []byte("a")), envelope(1, []byte("bc"))...), envelope(2, []byte("{}"))...), []string{"a", "bc", "{}"}, []byte{0, 1, 2}, 0},
		{"zero length", envelope(0, nil), []string{""}, []byte{0}, 0},
		{"partial header", []byte{0, 0, 0}, nil, nil, 3},
		{"partial body", envelope(0, []byte("abcdef"))[:8], nil, nil, 8},
		{"oversized skipped", append(envelope(0, big), envelope(0, []byte("after"))...), []string{"after"}, []byte{0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, msgs, rest := ParseEnvelopes(tt.in)
			var got []string
			for _, m := range msgs {
				got = append(got, string(m))
			}
			if len(got) != len(tt.wantMsgs) {
				t.Fatalf("ParseEnvelopes = %d messages %q, want %q", len(got), got, tt.wantMsgs)
			}
			for i := range got {
				if got[i] != tt.wantMsgs[i] || flags[i] != tt.wantFlags[i] {
					t.Errorf("message %d = %q flags %d, want %q flags %d", i, got[i], flags[i], tt.wantMsgs[i], tt.wantFlags[i])
				}
			}
			if rest != tt.wantRest {
				t.Errorf("rest = %d, want %d", rest, tt.wantRest)
			}
		})
	}
}

// FuzzParseEnvelopes checks that however a stream is cut into pieces, the
// incremental parser finds the same messages as one pass over it, and never
// panics on garbage.
func FuzzParseEnvelopes(f *testing.F) {
	f.Add(envelope(0, []byte("hello")), uint8(1))
	f.Add(append(envelope(0, []byte("a")), envelope(2, []byte(`{"error":{}}`))...), uint8(3))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3}, uint8(2))
	f.Add(append(envelope(0, nil), envelope(1, []byte{0x1f, 0x8b})...), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		wantFlags, wantMsgs, _ := ParseEnvelopes(data)
		var gotFlags []byte
		var gotMsgs [][]byte
		p := envelopeParser{onMsg: func(f byte, m []byte) {
			gotFlags = append(gotFlags, f)
			gotMsgs = append(gotMsgs, bytes.Clone(m))
		}}
		n := int(step)%7 + 1
		for i := 0; i < len(data); i += n {
			p.Write(data[i:min(i+n, len(data))])
		}
		if !bytes.Equal(gotFlags, wantFlags) || len(gotMsgs) != len(wantMsgs) {
			t.Fatalf("chunked by %d: %d messages flags %v, one pass: %d flags %v", n, len(gotMsgs), gotFlags, len(wantMsgs), wantFlags)
		}
		for i := range gotMsgs {
			if !bytes.Equal(gotMsgs[i], wantMsgs[i]) {
				t.Fatalf("chunked by %d: message %d = %q, want %q", n, i, gotMsgs[i], wantMsgs[i])
			}
		}
		// Codecs must not panic on whatever the messages hold.
		for i, m := range gotMsgs {
			for _, c := range []codec{{}, {json: true}, {gzip: true}} {
				var ev Entry
				describe(&ev, KindExec, c, gotFlags[i], m)
				c.endStream(gotFlags[i], m)
			}
		}
	})
}

func TestCapture(t *testing.T) {
	tests := []struct {
		name   string
		pieces []int
	}{
		{"small", []int{10}},
		{"exactly one KiB", []int{1024}},
		{"many small", []int{300, 300, 300, 300, 300, 300, 300}},
		{"one big", []int{5000}},
		{"big then small", []int{5000, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c capture
			var all []byte
			k := 0
			for _, n := range tt.pieces {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(k)
					k++
				}
				all = append(all, b...)
				c.add(b)
			}
			s := c.stream()
			if s.Bytes != int64(len(all)) {
				t.Errorf("Bytes = %d, want %d", s.Bytes, len(all))
			}
			if want := all[:min(len(all), captureKiB)]; !bytes.Equal(s.Head, want) {
				t.Errorf("Head = %d bytes, want first %d", len(s.Head), len(want))
			}
			if want := all[max(0, len(all)-captureKiB):]; !bytes.Equal(s.Tail, want) {
				t.Errorf("Tail = %d bytes, want last %d", len(s.Tail), len(want))
			}
		})
	}
}
