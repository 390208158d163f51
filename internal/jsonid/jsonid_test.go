package jsonid

import (
	"bufio"
	"bytes"
	"io"
	"testing"
	"testing/iotest"
	"time"
)

// chunked reads data in pieces of the given sizes, cycling.
type chunked struct {
	data  []byte
	sizes []int
	i     int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := max(1, c.sizes[c.i%len(c.sizes)])
	c.i++
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func rename(t testing.TB, in string, sizes []int, from, to string) string {
	t.Helper()
	out, err := io.ReadAll(iotest.OneByteReader(Rename(io.NopCloser(&chunked{data: []byte(in), sizes: sizes}), from, to)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestRename: the node's ID is replaced as a whole JSON string only,
// across any split of the stream, the last line without its newline too.
func TestRename(t *testing.T) {
	const node, gw = "nodesandbox000000001", "gatewaysandbox000001"
	in := `{"sandbox_id":"` + node + `","cmd":"echo ` + node + `"}` + "\n" +
		`{"sandbox_id":"` + node + `x","note":"` + node + `"}` + "\n" + `["` + node + `"]`
	want := `{"sandbox_id":"` + gw + `","cmd":"echo ` + node + `"}` + "\n" +
		`{"sandbox_id":"` + node + `x","note":"` + gw + `"}` + "\n" + `["` + gw + `"]`
	for _, sizes := range [][]int{{1}, {7}, {3, 19, 40}, {1 << 20}} {
		if got := rename(t, in, sizes, node, gw); got != want {
			t.Errorf("chunks %v:\n got %s\nwant %s", sizes, got, want)
		}
	}
}

// TestRenameStreams: a followed stream's record comes through as soon as
// its line is whole, before the next one is written.
func TestRenameStreams(t *testing.T) {
	pr, pw := io.Pipe()
	lines := bufio.NewReader(Rename(pr, "aaa", "bbb"))
	go func() { _, _ = pw.Write([]byte(`{"id":"aaa"}` + "\n")) }()
	got := make(chan string, 1)
	go func() {
		l, _ := lines.ReadString('\n')
		got <- l
	}()
	select {
	case l := <-got:
		if l != `{"id":"bbb"}`+"\n" {
			t.Errorf("first record = %q", l)
		}
	case <-time.After(time.Minute):
		t.Fatal("the first record did not come through before the stream went on")
	}
	pw.Close()
}

// FuzzRename: whatever the input and however it is split, the output is
// the input with every quoted old ID replaced.
func FuzzRename(f *testing.F) {
	f.Add([]byte(`{"a":"abc"}`+"\n"+`"abc"`), 3)
	f.Add([]byte("\n\n\"abc\"\"abc\"\n"), 1)
	f.Fuzz(func(t *testing.T, in []byte, size int) {
		if size < 0 {
			size = -size
		}
		got := rename(t, string(in), []int{size%64 + 1, 5}, "abc", "xyzw")
		if want := string(bytes.ReplaceAll(in, []byte(`"abc"`), []byte(`"xyzw"`))); got != want {
			// A split line is replaced as a whole: the same result.
			t.Errorf("got %q, want %q", got, want)
		}
	})
}
