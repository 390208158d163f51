package daemon

import (
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
)

// ContentionEnv, set to 1 in the daemon's environment, turns on the mutex
// and block profiles (off by default: they cost on every contended lock).
const ContentionEnv = "BERTH_PROFILE_CONTENTION"

// socketMux is what the root-only local socket serves: everything mux
// does, plus Go's profiler under /debug/pprof/. Only the socket has it:
// its 0600 mode is the operator's authentication, and profiles name
// sandboxes' paths and arguments. For example:
//
//	curl --unix-socket /var/lib/berth/berth.sock -o cpu.pprof 'http://x/debug/pprof/profile?seconds=20'
func socketMux(mux http.Handler) http.Handler {
	if os.Getenv(ContentionEnv) == "1" {
		runtime.SetMutexProfileFraction(5)
		runtime.SetBlockProfileRate(int((100 * 1000))) // one sample per 100 µs blocked
	}
	sm := http.NewServeMux()
	sm.Handle("/", mux)
	sm.HandleFunc("/debug/pprof/", pprof.Index)
	sm.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	sm.HandleFunc("/debug/pprof/profile", pprof.Profile)
	sm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	sm.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return sm
}
