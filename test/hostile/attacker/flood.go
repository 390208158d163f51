package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// floods are the tools that load the daemon from inside a sandbox
// (connections, DNS queries) and the probes that check it still serves.
// They report numbers, not "blocked:"/"ESCAPED:": the tests judge them
// by what the host reports.
func floods() map[string]func([]string) {
	return map[string]func([]string){
		// connflood N ADDR READYFILE: open N TCP connections to ADDR, send
		// nothing, write READYFILE once all were tried, and hold them.
		// ADDR "dns" is the sandbox's resolver (DNS over TCP).
		"connflood": func(a []string) {
			n, _ := strconv.Atoi(arg(a, 0))
			addr := arg(a, 1)
			if addr == "dns" {
				addr = resolver()
			}
			var conns []net.Conn
			failed := 0
			for range n {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					failed++
					continue
				}
				conns = append(conns, c)
			}
			msg := fmt.Sprintf("opened %d of %d connections (%d failed)\n", len(conns), n, failed)
			fmt.Print(msg)
			if err := os.WriteFile(arg(a, 2), []byte(msg), 0o644); err != nil {
				failed2("write ready file: %v", err)
			}
			select {} // hold them until killed
		},
		// dnsflood N: send N queries for random names to the sandbox's
		// resolver as fast as possible; count the answers.
		"dnsflood": func(a []string) {
			n, _ := strconv.Atoi(arg(a, 0))
			c, err := net.Dial("udp", resolver())
			if err != nil {
				failed2("dial resolver: %v", err)
			}
			var answered atomic.Int64
			go func() {
				buf := make([]byte, 2048)
				for {
					if _, err := c.Read(buf); err != nil {
						if ne, ok := err.(net.Error); ok && ne.Timeout() {
							continue
						}
						return
					}
					answered.Add(1)
				}
			}()
			var b [6]byte
			for i := range n {
				rand.Read(b[:])
				m := new(dns.Msg)
				m.SetQuestion("r"+hex.EncodeToString(b[:])+".flood.test.", dns.TypeA)
				m.Id = uint16(i)
				p, _ := m.Pack()
				c.Write(p)
			}
			// Answers still in flight arrive within a moment.
			time.Sleep(time.Second)
			fmt.Printf("sent %d queries, %d answered\n", n, answered.Load())
		},
		// lookup NAME: one query; prints the answer's rcode.
		"lookup": func(a []string) {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(arg(a, 0)), dns.TypeA)
			in, err := dns.Exchange(m, resolver())
			if err != nil {
				fmt.Printf("lookup %s: %v\n", arg(a, 0), err)
				return
			}
			fmt.Printf("lookup %s: %s\n", arg(a, 0), dns.RcodeToString[in.Rcode])
		},
		// fetch ADDR HOST: one HTTP GET through the proxy; prints the
		// status line.
		"fetch": func(a []string) {
			c, err := net.DialTimeout("tcp", arg(a, 0), 10*time.Second)
			if err != nil {
				fmt.Printf("fetch: %v\n", err)
				os.Exit(1)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", arg(a, 1))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				fmt.Printf("fetch: %v\n", err)
				os.Exit(1)
			}
			fmt.Print(line)
		},
	}
}

func arg(a []string, i int) string {
	if i >= len(a) {
		failed2("missing argument %d", i+1)
	}
	return a[i]
}

func failed2(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// resolver is the first nameserver of /etc/resolv.conf, as host:53.
func resolver() string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		failed2("read resolv.conf: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53")
		}
	}
	failed2("no nameserver in resolv.conf")
	return ""
}
