// Package process holds the messages of the process.Process service: the
// in-sandbox agent's process API, wire-compatible with E2B envd. Generated
// from process.proto by gen.sh; this file is not generated.
package process
