package template

import (
	"errors"
	"slices"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestStartOptionsValidate(t *testing.T) {
	good := []StartOptions{
		{},
		{Cmd: "exec server"},
		{FromImage: true, Ready: &ReadyCheck{Port: 8080}},
		{Ready: &ReadyCheck{File: "/tmp/ready", TimeoutSeconds: 5}},
		{Cmd: "x", Ready: &ReadyCheck{Cmd: "test -e /x"}},
	}
	for _, o := range good {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
	}
	bad := []StartOptions{
		{Cmd: "x", FromImage: true},
		{Cmd: "a\x00b"},
		{Ready: &ReadyCheck{}},
		{Ready: &ReadyCheck{Port: 80, File: "/x"}},
		{Ready: &ReadyCheck{Port: 70000}},
		{Ready: &ReadyCheck{Port: -1}},
		{Ready: &ReadyCheck{File: "relative"}},
		{Ready: &ReadyCheck{Cmd: "true", TimeoutSeconds: -1}},
		{Ready: &ReadyCheck{Cmd: "true", TimeoutSeconds: 7200}},
	}
	for _, o := range bad {
		if err := o.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v, want invalid argument", o, err)
		}
	}
}

func TestStartOptionsApply(t *testing.T) {
	var d Defaults
	if err := (StartOptions{Cmd: "serve", Ready: &ReadyCheck{Port: 1}}).apply(&d, []string{"/img"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Start, []string{"/bin/sh", "-c", "serve"}) || d.Ready == nil || d.Ready.Port != 1 {
		t.Errorf("apply(cmd) = %+v", d)
	}
	d = Defaults{}
	if err := (StartOptions{FromImage: true}).apply(&d, []string{"/entry", "arg"}); err != nil || !slices.Equal(d.Start, []string{"/entry", "arg"}) {
		t.Errorf("apply(from image) = %+v, %v", d, err)
	}
	if err := (StartOptions{FromImage: true}).apply(&d, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("apply(from image without a command) = %v", err)
	}
	if got := (ReadyCheck{}).Timeout(); got != DefaultReadyTimeout {
		t.Errorf("default timeout %v", got)
	}
	if got := (ReadyCheck{Port: 80}).String(); got != "ready port 80" {
		t.Errorf("String = %q", got)
	}
}
