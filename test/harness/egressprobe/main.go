// Command egressprobe runs inside a sandbox in the egress tests: it makes
// one connection of a given kind and reports what happened. Exit 0: it
// worked (HTTP 2xx, echo returned, DNS answered); 2: HTTP answered non-2xx;
// 1: it could not get through.
//
//	egressprobe https NAME [-connect IP:PORT] [-host HOST] [-method M] [-path P] [-ca FILE]
//	egressprobe http  HOST [-connect IP:PORT] [-path P]
//	egressprobe dns   NAME [-server IP:PORT]
//	egressprobe tcp   IP:PORT
//	egressprobe udp   IP:PORT
//	egressprobe bulk  URL   (downloads, prints bytes)
//	egressprobe lat   NAME -n N [-path P] [-ca FILE]  (N fresh HTTPS requests, prints the median in µs)
//	egressprobe keepalive HOST -connect IP:PORT -path P -wait FILE
//	    (two plain HTTP/1.1 requests on one connection, the second once
//	    FILE exists; prints first=STATUS and second=STATUS or error)
//	egressprobe tcpstream IP:PORT -wait FILE  (echo once, then again on the
//	    same connection once FILE exists; prints first= and second=)
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: egressprobe KIND TARGET [flags]")
		os.Exit(64)
	}
	kind, target := os.Args[1], os.Args[2]
	fs := flag.NewFlagSet(kind, flag.ExitOnError)
	connect := fs.String("connect", "", "dial this address instead of resolving")
	host := fs.String("host", "", "Host header (default TARGET)")
	method := fs.String("method", "GET", "HTTP method")
	path := fs.String("path", "/", "HTTP path")
	caFile := fs.String("ca", "", "extra CA file")
	server := fs.String("server", "", "DNS server")
	sni := fs.String("sni", "\x00", "TLS server name (default TARGET)")
	n := fs.Int("n", 20, "requests (lat)")
	wait := fs.String("wait", "", "file whose appearance starts the second round")
	fs.Parse(os.Args[3:])
	timeout := 8 * time.Second
	if kind == "bulk" {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var err error
	switch kind {
	case "https", "http", "bulk":
		err = doHTTP(ctx, kind, target, *connect, *host, *method, *path, *caFile, *sni)
	case "lat":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var ds []time.Duration
		for i := 0; i < *n && err == nil; i++ {
			start := time.Now()
			err = doHTTP(ctx, "lat", target, *connect, *host, *method, *path, *caFile, *sni)
			ds = append(ds, time.Since(start))
		}
		if err == nil {
			slices.Sort(ds)
			fmt.Printf("median_us=%d\n", ds[len(ds)/2].Microseconds())
		}
	case "dns":
		err = doDNS(ctx, target, *server)
	case "tcp":
		err = doTCP(ctx, target)
	case "udp":
		err = doUDP(target)
	case "keepalive":
		err = doKeepAlive(target, *connect, *path, *wait)
	case "tcpstream":
		err = doTCPStream(target, *wait)
	default:
		err = fmt.Errorf("unknown kind %s", kind)
	}
	if err != nil {
		fmt.Println("error:", err)
		if _, ok := err.(statusErr); ok {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type statusErr struct{ code int }

func (s statusErr) Error() string { return fmt.Sprintf("HTTP status %d", s.code) }

func doHTTP(ctx context.Context, kind, target, connect, host, method, path, caFile, sni string) error {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		pool.AppendCertsFromPEM(pem)
	}
	scheme := "https"
	if kind == "http" {
		scheme = "http"
	}
	tcfg := &tls.Config{RootCAs: pool}
	if sni != "\x00" {
		tcfg.ServerName = sni
		if sni == "" {
			tcfg.InsecureSkipVerify = true // no SNI: nothing to verify against
		}
	}
	tr := &http.Transport{TLSClientConfig: tcfg, DisableKeepAlives: true}
	if connect != "" {
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", connect)
		}
	}
	url := scheme + "://" + target + path
	if kind == "bulk" {
		url = target
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if kind == "bulk" {
		start := time.Now()
		n, err := io.Copy(io.Discard, resp.Body)
		fmt.Printf("bytes=%d mbps=%.0f\n", n, float64(n)*8/1e6/time.Since(start).Seconds())
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if kind != "lat" {
		fmt.Print(string(body))
	}
	if kind == "lat" {
		return nil
	}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		fmt.Println("issuer=" + resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	if resp.StatusCode/100 != 2 {
		return statusErr{resp.StatusCode}
	}
	return nil
}

func doDNS(ctx context.Context, name, server string) error {
	r := net.DefaultResolver
	if server != "" {
		r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ips, err := r.LookupIPAddr(ctx, name)
	if err != nil {
		return err
	}
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

func doTCP(ctx context.Context, addr string) error {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("no echo: %w", err)
	}
	fmt.Print(string(buf))
	return nil
}

func doUDP(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	if _, err := c.Write([]byte("quic?")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("no reply: %w", err)
	}
	fmt.Println(string(buf[:n]))
	return nil
}

// waitFile waits for path to exist (the test creates it once it changed
// the policy), for at most a minute.
func waitFile(path string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear", path)
}

func doKeepAlive(host, connect, path, wait string) error {
	c, err := net.DialTimeout("tcp", connect, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	br := bufio.NewReader(c)
	round := func(name string) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			fmt.Printf("%s=error: %v\n", name, err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Printf("%s=%d\n", name, resp.StatusCode)
	}
	round("first")
	if err := waitFile(wait); err != nil {
		return err
	}
	round("second")
	return nil
}

func doTCPStream(addr, wait string) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	round := func(name string) {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 5)
		_, err := c.Write([]byte("ping\n"))
		if err == nil {
			_, err = io.ReadFull(c, buf)
		}
		if err != nil {
			fmt.Printf("%s=error: %v\n", name, err)
			return
		}
		fmt.Printf("%s=ok\n", name)
	}
	round("first")
	if err := waitFile(wait); err != nil {
		return err
	}
	round("second")
	return nil
}
