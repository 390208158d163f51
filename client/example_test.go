package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// A sandbox's life: create it, run a command, read a file it wrote, kill
// it. Needs a running daemon (berth serve), so it has no checked output.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c, err := client.FromEnv() // BERTH_URL, else http://127.0.0.1:2378
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "base", Memory: "256M", Timeout: "5m"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(context.WithoutCancel(ctx))

	code, err := sb.Exec(ctx, client.ExecRequest{
		Cmd:    "/bin/sh",
		Args:   []string{"-c", "echo hello from $(hostname) | tee /tmp/greeting"},
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", code)

	var buf bytes.Buffer
	if err := sb.ReadFile(ctx, "/tmp/greeting", &buf); err != nil {
		log.Fatal(err)
	}
	fmt.Print("file says: ", buf.String())
}

// Files stream both ways; directories come from ListDir.
func ExampleSandbox_WriteFile() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	sb := c.Sandbox("k2m4example") // a handle for an existing sandbox
	if err := sb.WriteFile(ctx, "/work/input.txt", strings.NewReader("some data\n")); err != nil {
		log.Fatal(err)
	}
	entries, err := sb.ListDir(ctx, "/work", 1)
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		fmt.Println(e.Type, e.Mode, e.Size, e.Path)
	}
}

// Errors keep their class across the wire.
func ExampleClient_Get() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Get(context.Background(), "doesnotexist")
	fmt.Println(client.ErrorCode(err))
}
