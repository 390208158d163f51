// Command udpecho answers each UDP datagram it receives on -listen with
// "echo " and the datagram, to the address it came from: the UDP server
// the tests put in sandboxes (busybox has none) for the UDP port tunnels
// and host ports. With -tcp it also echoes every TCP connection on that
// address back to itself, byte for byte (the benchmark's TCP server).
package main

import (
	"flag"
	"io"
	"log"
	"net"
)

func main() {
	listen := flag.String("listen", ":5353", "UDP address to answer on")
	tcp := flag.String("tcp", "", "TCP address to echo on (none if empty)")
	flag.Parse()
	pc, err := net.ListenPacket("udp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if *tcp != "" {
		ln, err := net.Listen("tcp", *tcp)
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					log.Fatal(err)
				}
				go func() {
					defer c.Close()
					_, _ = io.Copy(c, c) // the peer went away: nothing to say
				}()
			}
		}()
	}
	buf := make([]byte, 65536)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := pc.WriteTo(append([]byte("echo "), buf[:n]...), addr); err != nil {
			log.Print(err)
		}
	}
}
