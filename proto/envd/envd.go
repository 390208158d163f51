// Package envd names the protocol Berth's in-sandbox agent speaks, E2B
// envd's: the port it serves on inside every sandbox and the envd version
// it implements. The agent, the daemon (which starts it, proxies to it and
// reports it to E2B SDKs) and any client take them from here; it lives
// beside the protocol's generated code because the agent may import
// nothing host-side. It is hand-written, not generated.
package envd

// Port is where the agent listens inside every sandbox, and the port E2B
// clients name for it.
const Port = 49983

// Version is the envd version the agent is compatible with. The SDKs gate
// features on it (default user 0.4.0, CloseStdin 0.5.2, octet-stream and
// gzip uploads 0.5.7, watch entry info 0.6.3); control planes report it as
// envdVersion.
const Version = "0.6.13"

// ErrnoCallsEnv names the environment variable through which the runtime
// hands the agent system calls to fail with an errno of its own, for
// itself and everything it starts: "clone3:38,io_setup:38". gVisor's
// runsc answers every errno rule of an OCI seccomp profile with EPERM, so
// rules whose errno matters (ENOSYS, which callers fall back on) travel
// this way instead. The agent removes it from its environment.
const ErrnoCallsEnv = "BERTH_ERRNO_CALLS"

// PidsTasksFDsEnv names the environment variable through which the
// runtime hands the agent a workload cgroup it made on the host below the
// sandbox's (runc, cgroup v1): "WORK,ROOT", the descriptors of that
// cgroup's and the sandbox cgroup's "tasks" files, which the runtime
// opened for writing. The agent starts its processes in the workload
// cgroup, so its own threads are not counted in the workload's limit,
// and removes the variable from its environment.
const PidsTasksFDsEnv = "BERTH_PIDS_TASKS_FDS"

// TokenEnv names the environment variable that carries the agent's access
// token where the runtime cannot hand it over through a pipe; the agent
// then executes itself again without it (/proc/1/environ would show it).
const TokenEnv = "BERTH_AGENT_TOKEN"

// TokenFDEnv, in place of TokenEnv, names the descriptor of a pipe the
// agent reads its token from and closes: one the runtime handed it, or
// the agent's own across that re-exec.
const TokenFDEnv = "BERTH_AGENT_CRED_FD"
