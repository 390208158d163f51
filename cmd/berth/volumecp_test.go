package main

import "testing"

func TestParseVolumeArg(t *testing.T) {
	for in, want := range map[string]volumeArg{
		"cache:/a/b":  {volume: "cache", path: "/a/b"},
		"vol123:/":    {volume: "vol123", path: "/"},
		"./cache:/a":  {path: "./cache:/a"},
		"/tmp/x:/y":   {path: "/tmp/x:/y"},
		"cache:rel":   {path: "cache:rel"},
		"cache":       {path: "cache"},
		":/a":         {path: ":/a"},
		"out.tar":     {path: "out.tar"},
		"My.Vol-1:/p": {volume: "My.Vol-1", path: "/p"},
	} {
		if got := parseVolumeArg(in); got != want {
			t.Errorf("parseVolumeArg(%q) = %+v, want %+v", in, got, want)
		}
	}
}
