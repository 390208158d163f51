package e2bwire

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// E2B's template references are "name" or "name:tag". A name is a Berth
// template; each of its tags names one build: the build tagged
// DefaultTag (a name given without a tag) is the template NAME itself, a
// build with only other tags the template NAME-<first 8 of its build id>.

// DefaultTag is the tag of a name given without one.
const DefaultTag = "default"

var validTag = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// SplitTemplateRef splits "name[:tag]", checking both.
func SplitTemplateRef(s string) (name, tag string, err error) {
	name, tag, hasTag := strings.Cut(s, ":")
	if err := types.ValidTemplateName(name); err != nil {
		return "", "", err
	}
	if hasTag && !validTag.MatchString(tag) {
		return "", "", fmt.Errorf("tag %q: want [A-Za-z0-9._-], at most 64: %w", tag, errdefs.ErrInvalidArgument)
	}
	return name, tag, nil
}

// BadTag names the first of tags that is not a valid tag ("" if none is).
func BadTag(tags []string) string {
	for _, tg := range tags {
		if !validTag.MatchString(tg) {
			return fmt.Sprintf("tags: %q: want [A-Za-z0-9._-], at most 64", tg)
		}
	}
	return ""
}

// TagEntry is what one NAME:TAG names: a build and the Berth template it
// made.
type TagEntry struct {
	BuildID  string    `json:"build_id"`
	Template string    `json:"template"`
	Created  time.Time `json:"created"`
}

// The fields a Berth daemon adds to an E2B build's status, for the
// Kubernetes gateway (which makes a build its node ran the cluster's):
// the Berth template the build makes, its tags, when it was asked for and
// when its status last changed.
const (
	BuildTemplateField  = "berthTemplate"
	BuildTagsField      = "berthTags"
	BuildRequestedField = "berthRequestedAt"
	BuildUpdatedField   = "berthUpdatedAt"
	// BuildIDField, on a ready build, is the build ID of the template
	// it made (as the daemon has it now).
	BuildIDField = "berthBuildID"
)
