package hostnet

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/policy"
)

// TestDropLog: the firewall's refusals (TCP, UDP, in mode none and in
// mode allow) reach the DropLog's sink from the kernel, named by sandbox
// and destination, and a flood to one destination is aggregated.
func TestDropLog(t *testing.T) {
	requireRoot(t)
	var mu sync.Mutex
	var got []Drop
	ch := make(chan struct{}, 1000)
	dl, err := OpenDropLog(DropLogConfig{Instance: testInstance(t, 'l'), Window: time.Hour}, func(d Drop) {
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
		ch <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dl.Close)
	n := newTestNetwork(t, Config{LogGroup: dl.Group()})
	a := mustAttach(t, n, "sblog")
	target := netip.AddrPortFrom(a.HostIP, 9)
	// Mode none: a TCP connection and UDP datagrams, refused at once.
	if err := dialFrom(a.NetNSPath, target.String(), 5*time.Second); err == nil {
		t.Fatal("sandbox connected in mode none")
	}
	// ICMP (an echo request), before the flood below uses up the
	// logging burst.
	err = inNetns(a.NetNSPath, func() error {
		c, err := net.Dial("ip4:icmp", a.HostIP.String())
		if err != nil {
			return err
		}
		defer c.Close()
		echo := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
		sum := 0
		for i := 0; i < len(echo); i += 2 {
			sum += int(echo[i])<<8 | int(echo[i+1])
		}
		sum = (sum >> 16) + (sum & 0xffff)
		echo[2], echo[3] = ^byte(sum>>8), ^byte(sum)
		_, err = c.Write(echo)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = inNetns(a.NetNSPath, func() error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(a.HostIP, 443).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for range 50 { // a small flood: aggregated into one more record
			c.Write([]byte("quic?"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Mode allow: DNS to a foreign resolver.
	if err := n.SetMode(t.Context(), a.ID, policy.ModeAllow); err != nil {
		t.Fatal(err)
	}
	err = inNetns(a.NetNSPath, func() error {
		c, err := net.Dial("udp4", "198.51.100.77:53")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("dns?"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"tcp " + target.String() + " policy": false, "udp " + a.HostIP.String() + ":443 policy": false, "udp 198.51.100.77:53 dns": false, "icmp " + netip.AddrPortFrom(a.HostIP, 0).String() + " policy": false}
	deadline := time.After(30 * time.Second)
	for missing := len(want); missing > 0; {
		select {
		case <-ch:
		case <-deadline:
			mu.Lock()
			seen := fmt.Sprintf("%+v", got)
			mu.Unlock()
			t.Fatalf("drops seen: %s; want %v", seen, want)
		}
		mu.Lock()
		missing = 0
		for k := range want {
			want[k] = false
		}
		for _, d := range got {
			if d.Sandbox != a.ID {
				t.Errorf("drop %+v names another sandbox", d)
			}
			want[d.Proto+" "+d.Dst.String()+" "+d.Reason] = true
		}
		for _, ok := range want {
			if !ok {
				missing++
			}
		}
		mu.Unlock()
	}
	// The 50 datagrams: one record at once, the rest counted until the
	// window ends (Close flushes it); the kernel logs at most the burst
	// (and what the rate refills), the rest are refused unlogged.
	dl.Close()
	mu.Lock()
	defer mu.Unlock()
	udp, total := 0, 0
	for _, d := range got {
		if d.Proto == "udp" && d.Dst.Port() == 443 {
			udp++
			total += d.Count
		}
	}
	if udp != 2 || total < 2 || total > 50 {
		t.Errorf("UDP flood: %d records counting %d packets, want 2 counting 2-50", udp, total)
	}
}

func TestDropLogAggregates(t *testing.T) {
	var got []Drop
	d := &DropLog{cfg: DropLogConfig{Window: time.Second, MaxKeys: 2}, keys: map[dropKey]*destCount{}, sink: func(x Drop) { got = append(got, x) }}
	t0 := time.Unix(1000, 0)
	dst := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), p) }
	for i := range 10 {
		d.count(Drop{Time: t0, Sandbox: "a", Proto: "udp", Dst: dst(uint16(1 + i)), Reason: "policy", Count: 1})
	}
	// Two destinations reported at once, the other 8 folded into one key.
	if len(got) != 3 {
		t.Fatalf("after 10 destinations: %d records, want 3: %+v", len(got), got)
	}
	d.flush(t0.Add(2 * time.Second))
	if len(got) != 4 || got[3].Proto != "*" || got[3].Count != 7 {
		t.Errorf("flush: %+v; want the overflow key with 7", got)
	}
	d.flush(t0.Add(4 * time.Second))
	if len(d.keys) != 0 {
		t.Errorf("quiet keys kept: %v", d.keys)
	}
}

func TestParsePacket(t *testing.T) {
	v4 := []byte{0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 198, 51, 100, 7, 0x30, 0x39, 0x01, 0xbb}
	if p, dst := parsePacket(v4); p != "udp" || dst.String() != "198.51.100.7:443" {
		t.Errorf("parsePacket(v4 udp) = %s %s", p, dst)
	}
	if p, _ := parsePacket(v4[:10]); p != "?" {
		t.Errorf("short packet parsed as %s", p)
	}
	icmp := append([]byte{}, v4...)
	icmp[9] = 1
	if p, dst := parsePacket(icmp); p != "icmp" || dst.Port() != 0 {
		t.Errorf("parsePacket(icmp) = %s %s", p, dst)
	}
}

func FuzzParsePacket(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 198, 51, 100, 7, 0x30, 0x39, 0x01, 0xbb})
	f.Add(make([]byte, 40))
	f.Fuzz(func(t *testing.T, p []byte) { parsePacket(p) })
}
