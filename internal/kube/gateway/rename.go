package gateway

import (
	"net/http"
	"strings"

	"github.com/berth-sandbox/berth/internal/jsonid"
)

// renamed makes a node's JSON or NDJSON answer about a sandbox name the
// gateway's ID of it, to, where it names the node's, from (jsonid).
func renamed(resp *http.Response, from, to string) {
	if from == "" || from == to || !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		return
	}
	resp.Body = jsonid.Rename(resp.Body, from, to)
	// The length may change (IDs of other lengths).
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}
