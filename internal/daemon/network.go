package daemon

import (
	"context"
	"net/netip"

	"github.com/berth-sandbox/berth/internal/hostnet"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// managerNet is the host network as the Manager sees it: the same calls,
// with the Manager's own Attachment type, so package sandbox imports no
// host networking (and links no netlink or nftables). SetMode, which the
// Manager finds by type assertion, is promoted unchanged.
type managerNet struct{ *hostnet.Network }

func (n managerNet) AttachTo(ctx context.Context, id, nsPath string) (sandbox.Attachment, error) {
	a, err := n.Network.AttachTo(ctx, id, nsPath)
	return sandbox.Attachment(a), err
}

func (n managerNet) Lookup(ctx context.Context, id string) (sandbox.Attachment, error) {
	a, err := n.Network.Lookup(ctx, id)
	return sandbox.Attachment(a), err
}

// AttachToAt gives a resumed sandbox its old address when it is free
// (the Manager finds it by type assertion).
func (n managerNet) AttachToAt(ctx context.Context, id, nsPath string, addr netip.Addr) (sandbox.Attachment, error) {
	a, err := n.Network.AttachToAt(ctx, id, nsPath, addr)
	return sandbox.Attachment(a), err
}
