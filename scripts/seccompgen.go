//go:build ignore

// seccompgen prints the Go statements that register runsc's precompiled
// host seccomp programs into the map "programs" of runsc's boot/filter
// package: those of every platform without GPU or TPU proxies, which
// Berth never turns on. scripts/runsc-bin.sh runs it in its build module,
// against the pinned gVisor; it is not part of Berth's module.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"gvisor.dev/gvisor/runsc/boot/filter/config"
)

func main() {
	programs, err := config.PrecompiledPrograms()
	if err != nil {
		fmt.Fprintln(os.Stderr, "seccompgen:", err)
		os.Exit(1)
	}
	sort.Slice(programs, func(i, j int) bool { return programs[i].Name < programs[j].Name })
	n := 0
	for _, p := range programs {
		if !strings.Contains(p.Name, " NVProxy=false ") || !strings.Contains(p.Name, " TPUProxy=false ") {
			continue
		}
		fmt.Print(p.Registration("\t", "precompiledseccomp", "programs"))
		n++
	}
	if n == 0 {
		fmt.Fprintln(os.Stderr, "seccompgen: no program without device proxies")
		os.Exit(1)
	}
}
