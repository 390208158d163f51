package envd

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
)

// FileSignature is the signature E2B SDKs put on /files URLs (downloadUrl,
// uploadUrl) for a path, operation ("read" or "write"), user ("" for the
// default user) and optional expiry (unix seconds, 0 for none), made with
// the sandbox's access token: "v1_" + unpadded base64 of the sha256 of
// "path:operation:user:token[:expiration]". The agent checks it; the daemon
// uses it to find which sandbox a signed URL without a sandbox in it is for.
func FileSignature(path, operation, username, token string, expiration int64) string {
	parts := []string{path, operation, username, token}
	if expiration != 0 {
		parts = append(parts, strconv.FormatInt(expiration, 10))
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
