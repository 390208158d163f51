// Command udpecho answers each UDP datagram it receives on -listen with
// "echo " and the datagram, to the address it came from: the UDP server
// the tests put in sandboxes (busybox has none) for the UDP port tunnels
// and host ports.
package main

import (
	"flag"
	"log"
	"net"
)

func main() {
	listen := flag.String("listen", ":5353", "UDP address to answer on")
	flag.Parse()
	pc, err := net.ListenPacket("udp", *listen)
	if err != nil {
		log.Fatal(err)
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
