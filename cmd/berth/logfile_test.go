package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	// lumberjack removes old files beyond MaxBackups in the background
	// after each rotation; what matters here is that rotation happened.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	rotated := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "berth-") {
			rotated++
		}
	}
	if rotated == 0 {
		t.Errorf("no rotated log files in %s: %v", dir, entries)
	}
}

func TestLogOutputUnwritable(t *testing.T) {
	if _, _, _, err := logOutput("/proc/berth-test/berth.log", 0, 0); err == nil {
		t.Error("logOutput to an unwritable path succeeded")
	}
}
