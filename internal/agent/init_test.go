package agent

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func doReq(t *testing.T, method, url, token, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A claimed warm sandbox gets a new token, environment and default user
// through /init; the old token stops working at once.
func TestInitReplacesIdentity(t *testing.T) {
	e := newEnv(t, "pool-token")
	if got := doReq(t, "POST", e.url+"/init", "", `{"accessToken":"x"}`).StatusCode; got != http.StatusUnauthorized {
		t.Fatalf("init without token = %d, want 401", got)
	}
	if got := doReq(t, "POST", e.url+"/init", "pool-token", `{"envVars":{"1BAD":"x"}}`).StatusCode; got != http.StatusBadRequest {
		t.Fatalf("init with bad env name = %d, want 400", got)
	}
	if got := doReq(t, "POST", e.url+"/init", "pool-token", `{"defaultUser":"nobody-here"}`).StatusCode; got != http.StatusBadRequest {
		t.Fatalf("init with unknown user = %d, want 400", got)
	}
	body := `{"accessToken":"owner-token","envVars":{"SANDBOX_WIDE":"claimed","FOO":"bar"},"defaultUser":"tester"}`
	if got := doReq(t, "POST", e.url+"/init", "pool-token", body).StatusCode; got != http.StatusNoContent {
		t.Fatalf("init = %d, want 204", got)
	}
	if got := doReq(t, "GET", e.url+"/envs", "pool-token", "").StatusCode; got != http.StatusUnauthorized {
		t.Errorf("old token after init = %d, want 401", got)
	}
	resp := doReq(t, "GET", e.url+"/envs", "owner-token", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("new token after init = %d", resp.StatusCode)
	}
	var envs map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&envs); err != nil {
		t.Fatal(err)
	}
	if envs["SANDBOX_WIDE"] != "claimed" || envs["FOO"] != "bar" || envs["PATH"] == "" {
		t.Errorf("envs after init = %v", envs)
	}
	if u := e.srv.defaultUser(); u != "tester" {
		t.Errorf("default user = %q, want tester", u)
	}
}
