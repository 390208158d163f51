package client

import (
	"testing"

	"github.com/berth-sandbox/berth/proto/filesystem"
)

// Special files go out as type unspecified; the permissions string (as
// ls -l prints it) names them.
func TestEntryTypeFromProto(t *testing.T) {
	tests := []struct {
		typ   filesystem.FileType
		perms string
		want  FileType
	}{
		{filesystem.FileType_FILE_TYPE_FILE, "-rw-r--r--", TypeFile},
		{filesystem.FileType_FILE_TYPE_DIRECTORY, "drwxr-xr-x", TypeDir},
		{filesystem.FileType_FILE_TYPE_SYMLINK, "Lrwxrwxrwx", TypeSymlink},
		{filesystem.FileType_FILE_TYPE_UNSPECIFIED, "prw-r--r--", TypeFIFO},
		{filesystem.FileType_FILE_TYPE_UNSPECIFIED, "Srwxr-xr-x", TypeSocket},
		{filesystem.FileType_FILE_TYPE_UNSPECIFIED, "Dcrw-rw-rw-", TypeDevice},
		{filesystem.FileType_FILE_TYPE_UNSPECIFIED, "Drw-rw----", TypeDevice},
		{filesystem.FileType_FILE_TYPE_UNSPECIFIED, "", TypeUnknown},
	}
	for _, tt := range tests {
		got := entryFromProto(&filesystem.EntryInfo{Type: tt.typ, Permissions: tt.perms}).Type
		if got != tt.want {
			t.Errorf("entryFromProto(%v, %q).Type = %q, want %q", tt.typ, tt.perms, got, tt.want)
		}
	}
}
