package client

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/proto/datagram"
)

// UDPIdleTimeout is how long ForwardUDP keeps a peer's tunnel without a
// datagram either way, as a NAT keeps a UDP mapping (Linux conntrack's
// 120 s for a UDP stream).
const UDPIdleTimeout = 2 * time.Minute

// MaxUDPPeers bounds the peers ForwardUDP carries at once (each holds a
// tunnel); datagrams from more are dropped until one goes idle.
const MaxUDPPeers = 1024

// udpDialTimeout bounds the tunnel a new peer's first datagram opens.
const udpDialTimeout = 10 * time.Second

// ForwardUDP serves pc until ctx ends (nil) or pc fails: each peer that
// sends to pc gets a tunnel of its own to port in the sandbox (DialUDP),
// so the sandbox's server tells peers apart and its answers go back to
// the peer that asked, as a host port's NAT would. A peer's tunnel closes
// after idle (UDPIdleTimeout if 0) without a datagram either way; its
// next datagram opens another. It does not close pc.
func (s *Sandbox) ForwardUDP(ctx context.Context, pc net.PacketConn, port int, idle time.Duration) error {
	if idle <= 0 {
		idle = UDPIdleTimeout
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &udpForward{sb: s, pc: pc, port: port, idle: idle, peers: map[string]*udpPeer{}}
	stop := context.AfterFunc(ctx, func() { _ = pc.SetReadDeadline(time.Now()) })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer f.closeAll()
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.sweep(ctx)
	}()
	buf := make([]byte, datagram.MaxSize)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		p := f.peer(ctx, addr, &wg)
		if p == nil {
			continue
		}
		p.seen()
		if _, err := p.conn.Write(buf[:n]); err != nil && ctx.Err() == nil {
			// Its tunnel closed under it (the idle sweep took it just
			// before this datagram, or the daemon ended it): the
			// datagram goes through another.
			f.drop(addr.String(), p)
			if p = f.peer(ctx, addr, &wg); p != nil {
				p.seen()
				_, _ = p.conn.Write(buf[:n])
			}
		}
	}
}

type udpForward struct {
	sb   *Sandbox
	pc   net.PacketConn
	port int
	idle time.Duration

	mu    sync.Mutex
	peers map[string]*udpPeer
}

type udpPeer struct {
	conn *UDPConn
	mu   sync.Mutex
	last time.Time
}

func (p *udpPeer) seen() {
	p.mu.Lock()
	p.last = time.Now()
	p.mu.Unlock()
}

func (p *udpPeer) idleFor() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Since(p.last)
}

// peer is addr's tunnel, opened (and its answers carried back to addr)
// on its first datagram; nil when it cannot be opened or too many peers
// have one.
func (f *udpForward) peer(ctx context.Context, addr net.Addr, wg *sync.WaitGroup) *udpPeer {
	key := addr.String()
	f.mu.Lock()
	p := f.peers[key]
	full := len(f.peers) >= MaxUDPPeers
	f.mu.Unlock()
	if p != nil || full {
		return p
	}
	dctx, cancel := context.WithTimeout(ctx, udpDialTimeout)
	conn, err := f.sb.DialUDP(dctx, f.port)
	cancel()
	if err != nil {
		return nil
	}
	p = &udpPeer{conn: conn, last: time.Now()}
	f.mu.Lock()
	f.peers[key] = p
	f.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer f.drop(key, p)
		buf := make([]byte, datagram.MaxSize)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			p.seen()
			if _, err := f.pc.WriteTo(buf[:n], addr); err != nil && ctx.Err() != nil {
				return
			}
		}
	}()
	return p
}

// drop closes p's tunnel and forgets it (if it is still addr key's).
func (f *udpForward) drop(key string, p *udpPeer) {
	p.conn.Close()
	f.mu.Lock()
	if f.peers[key] == p {
		delete(f.peers, key)
	}
	f.mu.Unlock()
}

// sweep closes the tunnels of peers idle for f.idle, until ctx ends.
func (f *udpForward) sweep(ctx context.Context) {
	t := time.NewTicker(f.idle / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.mu.Lock()
		var idle []*udpPeer
		for key, p := range f.peers {
			if p.idleFor() >= f.idle {
				// Forgotten before it is closed: the peer's next
				// datagram opens another tunnel rather than finding
				// this one closing.
				delete(f.peers, key)
				idle = append(idle, p)
			}
		}
		f.mu.Unlock()
		for _, p := range idle {
			p.conn.Close() // its reader ends
		}
	}
}

func (f *udpForward) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.peers {
		p.conn.Close()
	}
}
