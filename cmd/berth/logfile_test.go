package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLogOutputRotates: a daemon log past its size limit moves to a
// rotated file and logging goes on in a fresh one; rotate starts a new
// file at once; old files beyond the limit are dropped.
func TestLogOutputRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log", "berth.log")
	w, rotate, closeLog, err := logOutput(path, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	log := slog.New(slog.NewTextHandler(w, nil))
	line := strings.Repeat("x", 1000)
	for range 1500 { // ~1.5 MB: one rotation at 1 MB
		log.Info("filler", "data", line)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() >= 1<<20 {
		t.Errorf("current log is %d bytes, want it rotated below 1 MiB", st.Size())
	}
	if err := rotate(); err != nil {
		t.Fatal(err)
	}
	log.Info("after_rotate")
	for range 3 {
		if err := rotate(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) != 0 {
		t.Errorf("log after rotating = %d bytes, %v; want a fresh empty file", len(b), err)
	}
	// Old files are compressed and pruned to two in the background after
	// each rotation: wait for that state (bounded), which also lets the
	// temp dir be removed.
	dir2 := filepath.Dir(path)
	deadline := time.Now().Add(30 * time.Second)
	for {
		entries, err := os.ReadDir(dir2)
		if err != nil {
			t.Fatal(err)
		}
		var gz, plain int
		for _, e := range entries {
			switch {
			case strings.HasPrefix(e.Name(), "berth-") && strings.HasSuffix(e.Name(), ".log.gz"):
				gz++
			case strings.HasPrefix(e.Name(), "berth-"):
				plain++
			}
		}
		if gz == 2 && plain == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rotated logs never settled to 2 gzipped files: %d gzipped, %d other: %v", gz, plain, entries)
		}
		// lumberjack compresses and prunes in its own goroutine and
		// reports nothing when done: the directory is the only signal.
		time.Sleep(10 * time.Millisecond)
	}
}
