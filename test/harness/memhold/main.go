// Command memhold holds memory the way a real workload does, for the pause
// benchmark: -mib MiB filled with pseudo-random bytes (none of it zero
// pages, none of it compressible), every page touched. Once all of it is
// written it creates the file -ready, then sleeps until killed.
package main

import (
	crand "crypto/rand"
	"flag"
	"log"
	"math/rand/v2"
	"os"
	"runtime"
	"time"
)

func main() {
	mib := flag.Int("mib", 256, "MiB to hold")
	ready := flag.String("ready", "", "file to create once the memory is held")
	flag.Parse()
	if *mib <= 0 || *ready == "" {
		log.Fatal("memhold: want -mib > 0 and -ready")
	}
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, *mib<<20)
	if _, err := rand.NewChaCha8(seed).Read(buf); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*ready, []byte("held\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(buf)
	}
}
