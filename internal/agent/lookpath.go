package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

var errNotExecutable = errors.New("executable file not found")

// lookPathIn is exec.LookPath against a given PATH, since a process's PATH
// is the one its request and the sandbox set, not the agent's.
func lookPathIn(file, path string) (string, error) {
	if file == "" {
		return "", errNotExecutable
	}
	if strings.Contains(file, "/") {
		if err := executable(file); err != nil {
			return "", err
		}
		return file, nil
	}
	if path == "" {
		path = defaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		cand := filepath.Join(dir, file)
		if executable(cand) == nil {
			return cand, nil
		}
	}
	return "", errNotExecutable
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return errNotExecutable
	}
	return nil
}
