package hostnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Sysctls set inside every sandbox netns, by path under /proc/sys.
//
//   - ip_unprivileged_port_start=0: the netns belongs to the host user
//     namespace, so the sandbox's root (mapped to an unprivileged host uid)
//     has no CAP_NET_BIND_SERVICE over it and could not serve on port 80.
//     Ports only matter inside the sandbox's own netns, so this gives away
//     nothing on the host.
//   - ping_group_range="0 2147483647": every group may open ICMP echo
//     (SOCK_DGRAM) sockets, so ping works without CAP_NET_RAW, as Docker
//     and containerd do. Whether an echo leaves the sandbox is the
//     firewall's decision, not this one's.
//   - IPv6 disabled on every interface (default is set before eth0 arrives,
//     so it inherits it): the host-side policy is IPv4-only for now, and an
//     interface with no IPv6 address also sends no router or neighbour
//     solicitations and takes no SLAAC address. The firewall drops IPv6 from
//     the sandbox anyway; this keeps the sandbox from even trying. Loopback
//     keeps ::1 (all=1 would remove it too) because programs that bind
//     "localhost" on ::1 should keep working inside the sandbox.
var sandboxSysctls = []struct{ path, value string }{
	{"net/ipv4/ip_unprivileged_port_start", "0"},
	{"net/ipv4/ping_group_range", "0 2147483647"},
	{"net/ipv6/conf/default/disable_ipv6", "1"},
}

// writeSysctl sets /proc/sys/<path>. IPv6 knobs are skipped on a kernel
// without IPv6: there is nothing to disable.
func writeSysctl(path, value string) error {
	err := os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
	if errors.Is(err, os.ErrNotExist) && strings.HasPrefix(path, "net/ipv6/") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sysctl %s=%q: %w", path, value, err)
	}
	return nil
}

// prepareNetnsDir makes dir a shared mount point, as iproute2 does for
// /var/run/netns, so that unmounting a netns file also unmounts the copies
// other mount namespaces took of it and the netns can really go away.
func prepareNetnsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("netns dir: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: bind it onto itself first.
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind netns dir %s: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("share netns dir %s: %w", dir, err)
	}
	return nil
}

// createNetns creates a new network namespace and bind-mounts it at path.
// The work happens on a dedicated, locked OS thread: unshare moves only that
// thread, and if it cannot be moved back the goroutine exits still locked,
// which makes the Go runtime kill the thread instead of reusing it.
func createNetns(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		mountErr := unix.Mount(src, path, "none", unix.MS_BIND, "")
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(mountErr, fmt.Errorf("restore netns: %w", err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		if mountErr != nil {
			mountErr = fmt.Errorf("bind-mount netns: %w", mountErr)
		}
		errc <- mountErr
	}()
	return <-errc
}

// bindNetns bind-mounts an existing network namespace at path.
func bindNetns(src, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount netns %s: %w", src, err)
	}
	return nil
}

// inNetns runs fn on a locked OS thread that has joined the netns at path.
// Like createNetns, the thread is only returned to the pool if it got back
// into its original netns.
func inNetns(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("restore netns: %w", err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// configureNetns sets the sandbox sysctls and brings loopback up.
func configureNetns(path string) error {
	err := inNetns(path, func() error {
		// /proc/sys/net resolves to the netns of the thread that opens it.
		for _, s := range sandboxSysctls {
			if err := writeSysctl(s.path, s.value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns sysctls: %w", err)
	}
	h, err := handleAt(path)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netns loopback: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("netns loopback up: %w", err)
	}
	return nil
}

// handleAt opens a netlink handle whose sockets live in the netns at path.
func handleAt(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", path, err)
	}
	return h, nil
}

// isNetnsMount reports whether path is a bind-mounted network namespace.
func isNetnsMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// removeNetns unmounts and removes the netns file at path; a missing or
// unmounted file is fine.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
