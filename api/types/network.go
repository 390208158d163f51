package types

import "time"

// Egress policy modes.
const (
	NetNone  = "none"  // nothing leaves the sandbox, DNS included (default)
	NetAllow = "allow" // only what the rules allow
	NetOpen  = "open"  // the public internet, never private or metadata addresses
	NetLearn = "learn" // nothing, but every attempt is recorded for a suggestion
)

// NetworkPolicy is a sandbox's egress policy. Allow and Deny hold domains
// ("github.com"), wildcards ("*.pypi.org": subdomains only), addresses and
// CIDRs with an optional port ("198.51.100.0/24:443"); deny wins. HTTP
// rules restrict a host to methods and path prefixes (its TLS is
// intercepted with the sandbox's own CA).
type NetworkPolicy struct {
	Mode  string     `json:"mode"`
	Allow []string   `json:"allow,omitempty"`
	Deny  []string   `json:"deny,omitempty"`
	HTTP  []HTTPRule `json:"http,omitempty"`
}

// HTTPRule allows Methods ("*" for any) on paths starting with Path at Host
// (an exact name or a *.wildcard).
type HTTPRule struct {
	Host    string   `json:"host"`
	Methods []string `json:"methods"`
	Path    string   `json:"path"`
}

// NetworkRecord is one egress decision from a sandbox's audit log.
type NetworkRecord struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	// Proto is dns, tcp, tls or http (or audit for a rate-limit record).
	Proto string `json:"proto"`
	// Name is the destination name (SNI, Host, DNS question), if any.
	Name   string `json:"name,omitempty"`
	IP     string `json:"ip,omitempty"`
	Port   uint16 `json:"port,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Decision is "allow" or "deny".
	Decision string `json:"decision"`
	Rule     string `json:"rule"`
	// Reason adds detail to a denial (forbidden address, Host≠SNI, …).
	Reason   string `json:"reason,omitempty"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
	// Count, when set, is how many decisions the record stands for
	// (repeats aggregated, firewall refusals to one destination, or
	// decisions over the audit rate limit), from Time to Last.
	Count int64     `json:"count,omitempty"`
	Last  time.Time `json:"last,omitzero"`
}

// NetworkRecordList is the answer to GET /v1/sandboxes/{id}/network/log;
// with follow=true the records come one per line (NDJSON) instead.
type NetworkRecordList struct {
	Records []NetworkRecord `json:"records"`
}
