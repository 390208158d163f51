package agent

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// maxReservedThreads bounds the threads the agent makes at its start
// (ThreadReserve).
const maxReservedThreads = 32

// ThreadReserve is how many OS threads the agent makes at its start
// (ReserveThreads): maxReservedThreads, or a quarter of the sandbox's
// task limit where that is less (its RLIMIT_NPROC, which the runtime sets
// to the pids limit), so a small limit keeps most of its room for the
// workload and the reserve itself always fits.
func ThreadReserve() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return maxReservedThreads
	}
	return reserveFor(lim.Cur)
}

// reserveFor is ThreadReserve for a task limit of limit.
func reserveFor(limit uint64) int {
	return int(min(maxReservedThreads, limit/4))
}

// ReserveThreads makes the process hold more than n OS threads, so the Go
// runtime has idle ones to take later instead of making new ones. A
// workload that fills the sandbox's pids limit (a fork bomb, under runc,
// shares the sandbox's pids cgroup and uid with the agent) leaves no room
// for a new thread, and a Go program that cannot make one when it needs
// it dies ("fatal error: newosproc"): seen as the agent's end, and with it
// the sandbox's, right after such a workload started. The runtime keeps
// idle threads for good, so the agent needs a new one only while more
// than n are busy at once. n goroutines here each lock themselves to a
// thread of their own (an idle one, or one the runtime makes) and wait
// until all are in; then they unlock and end, and their threads stay,
// idle.
func ReserveThreads(n int) {
	var in sync.WaitGroup
	release := make(chan struct{})
	done := make(chan struct{}, n)
	for range n {
		in.Add(1)
		go func() {
			runtime.LockOSThread()
			in.Done()
			<-release
			runtime.UnlockOSThread()
			done <- struct{}{}
		}()
	}
	in.Wait()
	close(release)
	for range n {
		<-done
	}
}
