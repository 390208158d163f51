package agent

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// FuzzFilesQuery feeds arbitrary query strings and tokens to /files. The
// trust boundary holds when: nothing panics; without the right token or a
// valid signature the answer is 401 before any path is touched; and every
// path the handler would act on is clean and absolute.
func FuzzFilesQuery(f *testing.F) {
	const token = "secret-token"
	valid := url.Values{"path": {"/etc/hostname"}, "username": {"root"}}
	valid.Set("signature", Signature("/etc/hostname", "read", "root", token, 0))
	expired := url.Values{"path": {"x"}, "signature_expiration": {"1"}}
	expired.Set("signature", Signature("x", "read", "", token, 1))
	for _, q := range []string{
		"", "path=/etc/passwd", "path=../../../etc/shadow&username=root",
		"path=%00&signature=v1_x", "signature_expiration=abc&signature=v1_",
		"path=~other/x", valid.Encode(), expired.Encode(),
		"path=a;b&path=c", "signature=" + url.QueryEscape(Signature("", "read", "", token, 0)),
	} {
		f.Add(q, "")
		f.Add(q, token)
		f.Add(q, "wrong")
	}
	srv, err := New(Config{Token: token, PasswdPath: "/nonexistent", GroupPath: "/nonexistent"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Close)
	f.Fuzz(func(t *testing.T, rawQuery, hdr string) {
		r := httptest.NewRequest(http.MethodGet, "/files", nil)
		r.URL.RawQuery = rawQuery
		if hdr != "" {
			r.Header.Set("X-Access-Token", hdr)
		}
		err := srv.authorizeFiles(r, "read")
		q := r.URL.Query()
		if err == nil && hdr != token {
			// Only a correct, unexpired signature may stand in for the token.
			var exp int64
			if v := q.Get("signature_expiration"); v != "" {
				exp, _ = strconv.ParseInt(v, 10, 64)
			}
			if q.Get("signature") != Signature(q.Get("path"), "read", q.Get("username"), token, exp) {
				t.Fatalf("query %q with token %q authorized without a valid signature", rawQuery, hdr)
			}
			if exp != 0 && exp < time.Now().Unix() {
				t.Fatalf("query %q authorized with an expired signature", rawQuery)
			}
		}
		if hdr != "" && hdr != token && err == nil {
			t.Fatalf("wrong header token %q accepted", hdr)
		}
		if p, err := resolvePath(q.Get("path"), "/root"); err == nil && (p == "" || p[0] != '/') {
			t.Fatalf("path %q resolved to %q", q.Get("path"), p)
		}
		if err != nil {
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, r)
			if rec.Code != http.StatusUnauthorized {
				t.Fatalf("unauthorized /files?%s answered %d, want 401", rawQuery, rec.Code)
			}
		}
	})
}
