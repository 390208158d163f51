package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRenamed: a node's JSON answer names the gateway's ID; anything else
// (a diff) is left as it is.
func TestRenamed(t *testing.T) {
	const node, gw = "nodesandbox000000001", "gatewaysandbox000001"
	for ct, want := range map[string]string{"application/json": `"` + gw + `"`, "application/x-ndjson": `"` + gw + `"`, "text/x-diff": `"` + node + `"`} {
		resp := &http.Response{Header: http.Header{"Content-Type": {ct}, "Content-Length": {"22"}}, ContentLength: 22,
			Body: io.NopCloser(strings.NewReader(`"` + node + `"`))}
		renamed(resp, node, gw)
		if b, _ := io.ReadAll(resp.Body); string(b) != want {
			t.Errorf("%s: %s, want %s", ct, b, want)
		}
	}
}
