package dockerfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestParse(t *testing.T) {
	p, err := Parse(strings.NewReader(`# syntax is ignored
ARG BASE=berth:minimal
FROM $BASE
ARG GREETING=hi
ENV A=1 B="two words"
WORKDIR /app
COPY --chown=user:user src/ /app/src/
ADD file.txt /app/
RUN echo $GREETING > /app/greeting \
 && echo done
USER user
LABEL x=y
EXPOSE 8080
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["exec sleep 1000"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.MetaArgs) != 1 || p.FromRef != "$BASE" || p.From.Line != 3 || len(p.Steps) != 11 {
		t.Fatalf("plan = %+v", p)
	}
	if p.Steps[5].Line != 9 || !strings.Contains(p.Steps[5].Text, "echo done") {
		t.Errorf("RUN step = %+v", p.Steps[5])
	}
}

func TestParseStages(t *testing.T) {
	p, err := Parse(strings.NewReader("ARG V=1\nFROM berth:minimal AS build\nRUN make\nFROM build AS test\nRUN test\nFROM berth:minimal\nCOPY --from=build /out /app\nCOPY --from=1 --chmod=0755 /t /t\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Prior) != 2 || p.Prior[0].Name != "build" || p.Prior[1].FromRef != "build" || len(p.Prior[1].Steps) != 1 {
		t.Fatalf("prior stages %+v", p.Prior)
	}
	if len(p.MetaArgs) != 1 || p.FromRef != "berth:minimal" || len(p.Steps) != 2 || p.Steps[1].Line != 8 {
		t.Fatalf("last stage %+v", p)
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]struct {
		src  string
		line string
	}{
		"no from":           {"RUN true\n", "line 1"},
		"empty":             {"", "no instructions"},
		"bad instr":         {"FROM x\nRUN true\nFROBNICATE now\n", "line 3"},
		"stage name twice":  {"FROM a AS one\nFROM b AS ONE\n", "line 2"},
		"copy from":         {"FROM a\nCOPY --from=b /x /y\n", "line 2"},
		"copy from itself":  {"FROM a AS one\nCOPY --from=one /x /y\n", "line 2"},
		"copy from later":   {"FROM a\nCOPY --from=1 /x /y\nFROM b\n", "line 2"},
		"copy from self #":  {"FROM a\nFROM b\nCOPY --from=1 /x /y\n", "line 3"},
		"bad chmod":         {"FROM a\nCOPY --chmod=999 x /y\n", "line 2"},
		"add url":           {"FROM a\n\nADD http://example.com/x /x\n", "line 3"},
		"run mount":         {"FROM a\nRUN --mount=type=cache,target=/x true\n", "line 2"},
		"shell":             {"FROM a\nSHELL [\"/bin/bash\", \"-c\"]\n", "line 2"},
		"healthcheck":       {"FROM a\nHEALTHCHECK CMD true\n", "line 2"},
		"env no value":      {"FROM a\nENV\n", "line 2"},
		"heredoc":           {"FROM a\nCOPY <<EOF /x\nhi\nEOF\n", "line 2"},
		"copy one arg":      {"FROM a\nCOPY x\n", "line 2"},
		"platform":          {"FROM --platform=linux/arm64 a\n", "line 1"},
		"onbuild":           {"FROM a\nONBUILD RUN x\n", "line 2"},
		"instr before from": {"ENV A=b\nFROM a\n", "line 1"},
	}
	for name, c := range cases {
		_, err := Parse(strings.NewReader(c.src))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.line) {
			t.Errorf("%s: %v, want invalid argument naming %q", name, err, c.line)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("FROM a\nRUN x\n")
	f.Add("ARG X\nFROM $X\nCOPY a b\nENV A=$X\n")
	f.Add("FROM a\nRUN [\"a\", \n")
	f.Fuzz(func(t *testing.T, src string) {
		p, err := Parse(strings.NewReader(src))
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Parse error not invalid_argument: %v", err)
			}
			return
		}
		for _, s := range p.Steps {
			if s.Cmd == nil || s.Line < 1 {
				t.Fatalf("bad step %+v", s)
			}
		}
	})
}
