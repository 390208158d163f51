package agent

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// errUnknownUser marks a user name that the sandbox's passwd file lacks.
var errUnknownUser = errors.New("unknown user")

// user is one account of the sandbox, read from its passwd and group files
// (not from the host: the agent has no libc and no NSS, and the files it
// reads are the sandbox's own).
type user struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, primary included
	Home   string
	Shell  string
}

// lookupUser reads passwdPath and groupPath fresh on every call, so accounts
// that a command adds (useradd) are usable right away.
func lookupUser(passwdPath, groupPath, name string) (*user, error) {
	if name == "" {
		return nil, fmt.Errorf("empty user name: %w", errUnknownUser)
	}
	f, err := os.Open(passwdPath)
	if err != nil {
		return nil, fmt.Errorf("read passwd: %w", err)
	}
	defer f.Close()
	var u *user
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 || fields[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("user %q: malformed passwd entry", name)
		}
		u = &user{Name: name, UID: uint32(uid), GID: uint32(gid), Home: fields[5], Shell: fields[6]}
		break
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read passwd: %w", err)
	}
	if u == nil {
		return nil, fmt.Errorf("user %q: %w", name, errUnknownUser)
	}
	if u.Home == "" {
		u.Home = "/"
	}
	u.Groups = []uint32{u.GID}
	g, err := os.Open(groupPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return u, nil
		}
		return nil, fmt.Errorf("read group: %w", err)
	}
	defer g.Close()
	sc = bufio.NewScanner(g)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil || uint32(gid) == u.GID {
			continue
		}
		for _, m := range strings.Split(fields[3], ",") {
			if m == name {
				u.Groups = append(u.Groups, uint32(gid))
				break
			}
		}
	}
	return u, sc.Err()
}

// idName maps a uid or gid to its name (for EntryInfo owner/group), or to
// the number when the file lacks it.
func idName(path string, id uint32) string {
	f, err := os.Open(path)
	if err != nil {
		return strconv.FormatUint(uint64(id), 10)
	}
	defer f.Close()
	want := strconv.FormatUint(uint64(id), 10)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[2] == want {
			return fields[0]
		}
	}
	return want
}

// usernameFromBasic extracts the user from `Authorization: Basic
// base64(user:)`, which is how E2B SDKs name the user to act as. It returns
// "" when the header is absent.
func usernameFromBasic(header string) (string, error) {
	if header == "" {
		return "", nil
	}
	scheme, enc, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", fmt.Errorf("authorization header: want Basic scheme")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", fmt.Errorf("authorization header: %w", err)
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}
