package hostnet

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, links and nftables tables")
	}
}

// testInstance returns a fresh instance name so parallel or leftover runs
// never share kernel objects.
func testInstance(t *testing.T, lead byte) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	out := []byte{lead}
	for _, c := range b {
		out = append(out, alphabet[int(c)%len(alphabet)])
	}
	return string(out)
}

// newTestNetwork builds a Network and removes everything it made at the end.
func newTestNetwork(t *testing.T, cfg Config) *Network {
	t.Helper()
	requireRoot(t)
	if cfg.Instance == "" {
		cfg.Instance = testInstance(t, 't')
	}
	n, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { cleanupNetwork(t, n) })
	return n
}

func cleanupNetwork(t *testing.T, n *Network) {
	t.Helper()
	ctx := context.Background() // t.Context is already cancelled in Cleanup
	ids, err := n.List(ctx)
	if err != nil {
		t.Errorf("cleanup List: %v", err)
	}
	for _, id := range ids {
		if err := n.Detach(ctx, id); err != nil {
			t.Errorf("cleanup Detach(%q): %v", id, err)
		}
	}
	if err := n.Teardown(ctx); err != nil {
		t.Errorf("cleanup Teardown: %v", err)
	}
}

func mustAttach(t *testing.T, n *Network, id string) Attachment {
	t.Helper()
	att, err := n.Attach(t.Context(), id)
	if err != nil {
		t.Fatalf("Attach(%q): %v", id, err)
	}
	return att
}

// listenIn opens a TCP listener inside the netns at path; the socket stays
// in that netns after the thread leaves it.
func listenIn(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := inNetns(path, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveEcho(ln)
	return ln
}

// serveEcho writes "ok" to every connection; it ends when ln is closed.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("ok"))
		c.Close()
	}
}

// dialFrom connects to addr from inside the netns at path (the socket is
// created on a thread inside it) and reads the greeting.
func dialFrom(path, addr string, timeout time.Duration) error {
	return inNetns(path, func() error { return dialRead(addr, timeout) })
}

func dialRead(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		return err
	}
	if string(buf) != "ok" {
		return errors.New("unexpected greeting " + string(buf))
	}
	return nil
}

func linkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}
