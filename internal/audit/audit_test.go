package audit

import (
	"context"
	"testing"
	"time"
)

func TestAppendReadRotateFollow(t *testing.T) {
	l, err := New(Config{Dir: t.TempDir(), MaxBytes: 400, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		dec := "allow"
		if i%2 == 1 {
			dec = "deny"
		}
		l.Append(Record{Sandbox: "sb1", Proto: "tls", Name: "a.test", Decision: dec, Rule: "r", Port: uint16(i)})
	}
	all, err := l.Read("sb1", Filter{})
	if err != nil || len(all) == 0 || len(all) > 6 {
		t.Fatalf("Read = %d records, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Port <= all[i-1].Port {
			t.Errorf("records out of order: %v", all)
		}
	}
	denied, _ := l.Read("sb1", Filter{DeniedOnly: true})
	for _, r := range denied {
		if !r.Denied() {
			t.Errorf("denied filter let %+v through", r)
		}
	}
	if _, err := l.Read("../x", Filter{}); err == nil {
		t.Error("Read accepted a path as sandbox id")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got := make(chan Record, 100)
	go l.Follow(ctx, "sb2", Filter{}, func(r Record) error { got <- r; return nil })
	deadline := time.Now().Add(time.Minute)
	for {
		l.Append(Record{Sandbox: "sb2", Proto: "dns", Decision: "allow"})
		select {
		case r := <-got:
			if r.Sandbox != "sb2" {
				t.Errorf("followed %+v", r)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("Follow saw nothing")
		}
	}
}
