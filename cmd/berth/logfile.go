package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"gopkg.in/natefinch/lumberjack.v2"
)

// Defaults for the daemon's log file rotation.
const (
	defaultLogMaxMB    = 100
	defaultLogMaxFiles = 5
)

// logOutput is where the daemon logs: stderr (journald under systemd), or
// path rotated by size (maxMB) keeping maxFiles compressed old files. The
// returned rotate starts a new file at once (SIGHUP); close flushes.
func logOutput(path string, maxMB, maxFiles int) (w io.Writer, rotate func() error, closeFn func() error, err error) {
	if path == "" {
		return os.Stderr, func() error { return nil }, func() error { return nil }, nil
	}
	if maxMB <= 0 {
		maxMB = defaultLogMaxMB
	}
	if maxFiles <= 0 {
		maxFiles = defaultLogMaxFiles
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, nil, fmt.Errorf("log file: %w", err)
	}
	// Open it now, so a path the daemon cannot write fails the start.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("log file: %w", err)
	}
	f.Close()
	l := &lumberjack.Logger{Filename: path, MaxSize: maxMB, MaxBackups: maxFiles, Compress: true}
	return l, l.Rotate, l.Close, nil
}
