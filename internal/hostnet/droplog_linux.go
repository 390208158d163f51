package hostnet

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"golang.org/x/sys/unix"
)

// Drop is one refusal the firewall made (the proxy and resolver never saw
// the packet), or, with Count > 1, several to one destination aggregated.
type Drop struct {
	Time    time.Time
	Sandbox string
	// Proto is udp, tcp, icmp or the IP protocol number.
	Proto string
	Dst   netip.AddrPort
	// Reason is "policy" (the mode or policy refuses it) or "dns" (DNS to
	// a resolver other than the sandbox's own).
	Reason string
	Count  int
}

// DropLogConfig configures a DropLog.
type DropLogConfig struct {
	// Instance is the daemon's instance name; the group is derived from it.
	Instance string
	// Window is how long packets to one destination are counted into one
	// record after the first was reported at once (default 5s).
	Window time.Duration
	// MaxKeys bounds the destinations counted at once; past it, a
	// sandbox's further destinations are counted under one key (default 4096).
	MaxKeys int
	Logger  *slog.Logger
}

// DropLog reads the firewall's refusals from the NFLOG group the sandbox
// chains log to, and hands them to a sink aggregated per sandbox and
// destination: the first packet at once, then one record per Window with
// the count, so a flood costs a record per destination per Window. The
// firewall rate-limits the logging itself (logRatePerSecond per rule).
type DropLog struct {
	cfg   DropLogConfig
	log   *slog.Logger
	group uint16
	nf    *nflog.Nflog
	sink  func(Drop)

	mu   sync.Mutex
	keys map[dropKey]*destCount

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type dropKey struct {
	sandbox, proto, reason string
	dst                    netip.AddrPort
}

type destCount struct {
	first   time.Time
	until   time.Time
	pending int
}

// OpenDropLog binds an NFLOG group for cfg.Instance (the first free one
// of a few derived from the name, so daemons on one host do not collide)
// and delivers refusals to sink until Close. Its Group goes into
// Config.LogGroup.
func OpenDropLog(cfg DropLogConfig, sink func(Drop)) (*DropLog, error) {
	if cfg.Window <= 0 {
		cfg.Window = 5 * time.Second
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &DropLog{cfg: cfg, log: cfg.Logger, sink: sink, keys: map[dropKey]*destCount{}}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	h := fnv.New32a()
	h.Write([]byte(cfg.Instance))
	base := 0x4000 + h.Sum32()%0x4000
	var last error
	for i := range uint32(32) {
		group := uint16(base + i)
		nf, err := nflog.Open(&nflog.Config{Group: group, Copymode: nflog.CopyPacket, Bufsize: logSnaplen})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("nflog: %w", err)
		}
		err = nf.RegisterWithErrorFunc(ctx, d.handle, func(err error) int {
			if ctx.Err() != nil {
				return 1
			}
			var oe interface{ Timeout() bool }
			if errors.As(err, &oe) && oe.Timeout() {
				return 0
			}
			// ENOBUFS: the kernel dropped messages we were slow to read;
			// keep reading.
			if errors.Is(err, unix.ENOBUFS) {
				d.log.Warn("drop_log_overrun")
				return 0
			}
			d.log.Error("drop_log_read_failed", "err", err)
			return 1
		})
		if err != nil {
			nf.Close()
			last = err
			continue
		}
		d.nf, d.group = nf, group
		break
	}
	if d.nf == nil {
		cancel()
		return nil, fmt.Errorf("nflog: no free group near %d: %w", base, last)
	}
	d.wg.Add(1)
	go d.flushLoop(ctx)
	return d, nil
}

// Group is the NFLOG group this DropLog reads.
func (d *DropLog) Group() uint16 { return d.group }

// Close stops reading and reports what is still being counted.
func (d *DropLog) Close() {
	d.cancel()
	d.nf.Close()
	d.wg.Wait()
	d.flush(time.Now().Add(24 * time.Hour))
}

func (d *DropLog) handle(a nflog.Attribute) int {
	if a.Prefix == nil || a.Payload == nil {
		return 0
	}
	chain, reason, _ := strings.Cut(*a.Prefix, " ")
	id, ok := cutPrefix(chain, chainPrefix)
	if !ok {
		return 0
	}
	proto, dst := parsePacket(*a.Payload)
	now := time.Now()
	if a.Timestamp != nil && !a.Timestamp.IsZero() {
		now = *a.Timestamp
	}
	d.count(Drop{Time: now, Sandbox: id, Proto: proto, Dst: dst, Reason: reason, Count: 1})
	return 0
}

// count reports the first drop to a destination at once and counts the
// rest until the window ends.
func (d *DropLog) count(dr Drop) {
	k := dropKey{sandbox: dr.Sandbox, proto: dr.Proto, reason: dr.Reason, dst: dr.Dst}
	d.mu.Lock()
	c := d.keys[k]
	if c == nil && len(d.keys) >= d.cfg.MaxKeys {
		// Too many destinations: count this sandbox's under one key.
		k = dropKey{sandbox: dr.Sandbox, proto: "*", reason: dr.Reason}
		c = d.keys[k]
	}
	if c != nil {
		c.pending++
		d.mu.Unlock()
		return
	}
	d.keys[k] = &destCount{first: dr.Time, until: dr.Time.Add(d.cfg.Window)}
	d.mu.Unlock()
	d.sink(dr)
}

func (d *DropLog) flushLoop(ctx context.Context) {
	defer d.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d.flush(now)
		}
	}
}

// flush reports the counts of windows that ended by now; a destination
// still being hit starts a new window, a quiet one is forgotten.
func (d *DropLog) flush(now time.Time) {
	var out []Drop
	d.mu.Lock()
	for k, c := range d.keys {
		if now.Before(c.until) {
			continue
		}
		if c.pending == 0 {
			delete(d.keys, k)
			continue
		}
		out = append(out, Drop{Time: now, Sandbox: k.sandbox, Proto: k.proto, Dst: k.dst, Reason: k.reason, Count: c.pending})
		c.pending, c.until = 0, now.Add(d.cfg.Window)
	}
	d.mu.Unlock()
	for _, dr := range out {
		d.sink(dr)
	}
}

// parsePacket reads the protocol and destination of an IPv4 or IPv6
// packet (the port is 0 where there is none, or the packet is cut short).
func parsePacket(p []byte) (string, netip.AddrPort) {
	if len(p) < 1 {
		return "?", netip.AddrPort{}
	}
	var proto byte
	var dst netip.Addr
	var l4 []byte
	switch p[0] >> 4 {
	case 4:
		if len(p) < 20 {
			return "?", netip.AddrPort{}
		}
		ihl := int(p[0]&0x0f) * 4
		proto = p[9]
		dst = netip.AddrFrom4([4]byte(p[16:20]))
		if ihl >= 20 && len(p) >= ihl {
			l4 = p[ihl:]
		}
	case 6:
		if len(p) < 40 {
			return "?", netip.AddrPort{}
		}
		proto = p[6]
		dst = netip.AddrFrom16([16]byte(p[24:40]))
		l4 = p[40:]
	default:
		return "?", netip.AddrPort{}
	}
	name := fmt.Sprint(proto)
	var port uint16
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		name = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto]
		if len(l4) >= 4 {
			port = binary.BigEndian.Uint16(l4[2:4])
		}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		name = "icmp"
	}
	return name, netip.AddrPortFrom(dst, port)
}
