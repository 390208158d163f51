// Package filesystem holds the messages of the filesystem.Filesystem
// service: the in-sandbox agent's file API, wire-compatible with E2B envd.
// Generated from filesystem.proto by gen.sh; this file is not generated.
package filesystem
