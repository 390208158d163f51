package template

import (
	"os"
	"testing"
	"time"
)

func TestZZExperiment(t *testing.T) {
	src := os.Getenv("EXP_SRC")
	if src == "" {
		t.Skip()
	}
	dst := "/work/tmp-template-exp/out"
	os.RemoveAll(dst)
	os.Mkdir(dst, 0o755)
	start := time.Now()
	if err := shiftCopy(t.Context(), src, dst, 100000, skipBase); err != nil {
		t.Fatal(err)
	}
	t.Logf("copy took %s", time.Since(start))
	start = time.Now()
	n, _ := dirSize(dst)
	t.Logf("size %d took %s", n, time.Since(start))
}
