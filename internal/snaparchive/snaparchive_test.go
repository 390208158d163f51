package snaparchive

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

func layerFiles(t *testing.T, contents ...string) []*os.File {
	t.Helper()
	var out []*os.File
	for i, c := range contents {
		f, err := os.Create(filepath.Join(t.TempDir(), "l"+string(rune('0'+i))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.WriteString(c); err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func archive(t *testing.T, contents ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	meta := Meta{Name: "n", Kind: "filesystem", Template: "base", CreatedAt: time.Unix(1, 0).UTC(), Env: map[string]string{"A": "1"}}
	if err := Write(&buf, meta, layerFiles(t, contents...), nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	b := archive(t, "first layer", "second")
	var got []string
	m, err := Read(bytes.NewReader(b), Format, func(i int, _ Layer, r io.Reader) error {
		data, err := io.ReadAll(r)
		got = append(got, string(data))
		return err
	}, nil)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if m.Snapshot.Template != "base" || m.Snapshot.Env["A"] != "1" || len(m.Layers) != 2 {
		t.Errorf("manifest = %+v", m)
	}
	if strings.Join(got, "|") != "first layer|second" {
		t.Errorf("layers = %q", got)
	}
}

// A reader that stops early still gets its digest checked over the whole
// layer.
func TestReadChecksWholeLayer(t *testing.T) {
	b := archive(t, "0123456789")
	if _, err := Read(bytes.NewReader(b), Format, func(int, Layer, io.Reader) error { return nil }, nil); err != nil {
		t.Fatalf("Read: %v", err)
	}
}

// rewrite rebuilds an archive's tar with edit applied to each entry.
func rewrite(t *testing.T, b []byte, edit func(h *tar.Header, body []byte) (*tar.Header, []byte)) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		h, body = edit(h, body)
		if h == nil {
			continue
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return out.Bytes()
}

func TestReadRejects(t *testing.T) {
	good := archive(t, "layer zero", "layer one")
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "no manifest"},
		{"tampered layer", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == "layers/1.tar" {
				return h, []byte("layer 0ne")
			}
			return h, body
		}), "digest"},
		{"resized layer", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == "layers/0.tar" {
				return h, append(body, 'x')
			}
			return h, body
		}), "the manifest says"},
		{"missing layer", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == "layers/1.tar" {
				return nil, nil
			}
			return h, body
		}), "layer 1"},
		{"escaping name", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == "layers/0.tar" {
				h.Name = "../../etc/passwd"
			}
			return h, body
		}), "where the manifest has"},
		{"manifest path", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == manifestName {
				return h, bytes.Replace(body, []byte(`"layers/0.tar"`), []byte(`"/etc/shadow"`), 1)
			}
			return h, body
		}), "want \"layers/0.tar\""},
		{"unknown field", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == manifestName {
				return h, bytes.Replace(body, []byte(`"format"`), []byte(`"extra": 1, "format"`), 1)
			}
			return h, body
		}), "unknown field"},
		{"wrong format", rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) {
			if h.Name == manifestName {
				return h, bytes.Replace(body, []byte(Format), []byte("berth-snapshot/9"), 1)
			}
			return h, body
		}), "format"},
		{"extra entry", append(rewrite(t, good, func(h *tar.Header, body []byte) (*tar.Header, []byte) { return h, body })[:0:0], func() []byte {
			var out bytes.Buffer
			tw := tar.NewWriter(&out)
			tr := tar.NewReader(bytes.NewReader(good))
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				body, _ := io.ReadAll(tr)
				tw.WriteHeader(h)
				tw.Write(body)
			}
			tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeReg, Size: 1})
			tw.Write([]byte("x"))
			tw.Close()
			return out.Bytes()
		}()...), "unexpected entry"},
	}
	for _, c := range cases {
		_, err := Read(bytes.NewReader(c.b), Format, func(_ int, _ Layer, r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }, discardMemory)
		if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Read = %v, want invalid argument mentioning %q", c.name, err, c.want)
		}
	}
}

// FuzzRead: no archive makes Read panic, hand a layer callback more bytes
// than the manifest declares, or succeed without every digest matching.
func FuzzRead(f *testing.F) {
	dir := f.TempDir()
	var buf bytes.Buffer
	var files []*os.File
	for i, c := range []string{"a layer", ""} {
		fl, err := os.Create(filepath.Join(dir, string(rune('a'+i))))
		if err != nil {
			f.Fatal(err)
		}
		fl.WriteString(c)
		files = append(files, fl)
	}
	if err := Write(&buf, Meta{Kind: "filesystem", Template: "base"}, files, nil); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	buf.Reset()
	if err := Write(&buf, Meta{Kind: "memory", Template: "base", AgentToken: "t"}, files[:1], []MemoryFile{{"checkpoint.img", files[1]}}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Add([]byte(`{"format":"berth-snapshot/1"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(bytes.NewReader(b), Format, func(i int, _ Layer, r io.Reader) error {
			n, err := io.Copy(io.Discard, r)
			if err == nil && n > 0 && i >= 0 && i < MaxLayers && n > 1<<30 {
				t.Errorf("layer %d: read %d bytes", i, n)
			}
			return err
		}, func(name string, r io.Reader) error {
			if !memoryName.MatchString(name) {
				t.Errorf("memory file handed over by name %q", name)
			}
			_, err := io.Copy(io.Discard, r)
			return err
		})
		if err == nil {
			if m.Format != Format || len(m.Layers) == 0 {
				t.Errorf("Read accepted %+v", m)
			}
			for i, l := range m.Layers {
				if l.File != layerFile(i) {
					t.Errorf("Read accepted layer name %q", l.File)
				}
			}
		}
	})
}

// FuzzParseManifest: a manifest is accepted only with layer names that
// are exactly layers/<i>.tar and hex digests.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"format":"berth-snapshot/1","snapshot":{"kind":"filesystem","template":"base","created_at":"2026-01-01T00:00:00Z"},"layers":[{"file":"layers/0.tar","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]}`))
	f.Add([]byte(`{"format":"berth-snapshot/1","layers":[{"file":"../x"}]}`))
	f.Add([]byte(`{"format":"berth-template/1","template":{"name":"x"},"layers":[{"file":"layers/0.tar","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		for i, l := range m.Layers {
			if l.File != layerFile(i) || !hexDigest.MatchString(l.SHA256) || l.Size < 0 || strings.Contains(l.File, "..") {
				t.Errorf("accepted layer %+v", l)
			}
		}
		for _, l := range m.Memory {
			name, ok := strings.CutPrefix(l.File, "memory/")
			if !ok || strings.ContainsAny(name, "/\x00") || strings.Contains(name, "..") || !hexDigest.MatchString(l.SHA256) || l.Size < 0 {
				t.Errorf("accepted memory file %+v", l)
			}
		}
		if len(m.Memory) > 0 && m.Snapshot.AgentToken == "" {
			t.Errorf("accepted a memory image without its agent token")
		}
		if (m.Format == TemplateFormat) != (len(m.Template) > 0) || (m.Format == TemplateFormat && len(m.Memory) > 0) {
			t.Errorf("accepted %s with template record %q and %d memory files", m.Format, m.Template, len(m.Memory))
		}
	})
}

func discardMemory(_ string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

// TestMemoryRoundTrip: a memory snapshot's image files travel after its
// layers, each by its plain name, with the agent token; a manifest with a
// memory file named out of its directory, without checkpoint.img, or
// without the token is refused.
func TestMemoryRoundTrip(t *testing.T) {
	files := layerFiles(t, "layer", "checkpoint data", "pages data", "ca cert", "ca key")
	var buf bytes.Buffer
	meta := Meta{Kind: "memory", Template: "base", AgentToken: "tok", CreatedAt: time.Unix(1, 0).UTC()}
	if err := Write(&buf, meta, files[:1], []MemoryFile{{"checkpoint.img", files[1]}, {"pages.img", files[2]}, {"berth-egress-ca.pem", files[3]}, {"berth-egress-ca.key", files[4]}}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	m, err := Read(bytes.NewReader(buf.Bytes()), Format, func(int, Layer, io.Reader) error { return nil }, func(name string, r io.Reader) error {
		b, err := io.ReadAll(r)
		got[name] = string(b)
		return err
	})
	if err != nil || m.Snapshot.AgentToken != "tok" || got["checkpoint.img"] != "checkpoint data" || got["pages.img"] != "pages data" ||
		got["berth-egress-ca.pem"] != "ca cert" || got["berth-egress-ca.key"] != "ca key" || len(got) != 4 {
		t.Fatalf("Read = %+v, %v, memory %q", m, err, got)
	}
	for _, name := range []string{"../x.img", "x.sh", ".pem", "-x.key", "a/b.key", "x.img.sh"} {
		if err := Write(&buf, meta, files[:1], []MemoryFile{{name, files[1]}}); err == nil {
			t.Errorf("Write took memory file name %q", name)
		}
	}
	digest := strings.Repeat("a", 64)
	for name, man := range map[string]string{
		"escaping name": `"memory":[{"file":"memory/../../etc/x.img","size":1,"sha256":"` + digest + `"}],"snapshot":{"kind":"memory","template":"b","agent_token":"t"}`,
		"no checkpoint": `"memory":[{"file":"memory/pages.img","size":1,"sha256":"` + digest + `"}],"snapshot":{"kind":"memory","template":"b","agent_token":"t"}`,
		"no token":      `"memory":[{"file":"memory/checkpoint.img","size":1,"sha256":"` + digest + `"}],"snapshot":{"kind":"memory","template":"b"}`,
		"twice":         `"memory":[{"file":"memory/checkpoint.img","size":1,"sha256":"` + digest + `"},{"file":"memory/checkpoint.img","size":1,"sha256":"` + digest + `"}],"snapshot":{"kind":"memory","template":"b","agent_token":"t"}`,
	} {
		b := `{"format":"berth-snapshot/1","layers":[{"file":"layers/0.tar","size":1,"sha256":"` + digest + `"}],` + man + `}`
		if _, err := ParseManifest([]byte(b)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: ParseManifest = %v; want invalid_argument", name, err)
		}
	}
}

// TestTemplateArchive: a template archive carries the store's record and
// its layers; it is not read where a snapshot archive is wanted (nor the
// other way round), and a manifest mixing the two kinds is refused.
func TestTemplateArchive(t *testing.T) {
	var buf bytes.Buffer
	rec := []byte(`{"name":"py"}`)
	if err := WriteTemplate(&buf, rec, time.Unix(1, 0).UTC(), layerFiles(t, "base layer", "top")); err != nil {
		t.Fatal(err)
	}
	var got []string
	m, err := Read(bytes.NewReader(buf.Bytes()), TemplateFormat, func(i int, l Layer, r io.Reader) error {
		b, err := io.ReadAll(r)
		if l.File != layerFile(i) || int64(len(b)) != l.Size {
			t.Errorf("layer %d: entry %+v, %d bytes read", i, l, len(b))
		}
		got = append(got, string(b))
		return err
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, m.Template); err != nil || compact.String() != string(rec) || len(got) != 2 || got[0] != "base layer" || got[1] != "top" {
		t.Errorf("Read = %+v, layers %q", m, got)
	}
	none := func(int, Layer, io.Reader) error { return nil }
	if _, err := Read(bytes.NewReader(buf.Bytes()), Format, none, discardMemory); err == nil || !strings.Contains(err.Error(), "want") {
		t.Errorf("a template archive read as a snapshot's: %v; want refused", err)
	}
	if _, err := Read(bytes.NewReader(archive(t, "l")), TemplateFormat, none, nil); err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a snapshot archive read as a template's: %v; want refused", err)
	}
	digest := `"layers":[{"file":"layers/0.tar","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}]`
	for _, bad := range []string{
		`{"format":"berth-template/1",` + digest + `}`,
		`{"format":"berth-template/1","template":{"name":"x"},"snapshot":{"kind":"filesystem","template":"base"},` + digest + `}`,
		`{"format":"berth-template/1","template":{"name":"x"},"memory":[{"file":"memory/checkpoint.img","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}],` + digest + `}`,
		`{"format":"berth-snapshot/1","template":{"name":"x"},"snapshot":{"kind":"filesystem","template":"base"},` + digest + `}`,
	} {
		if _, err := ParseManifest([]byte(bad)); err == nil {
			t.Errorf("ParseManifest(%s) accepted", bad)
		}
	}
}
