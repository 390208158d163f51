package review

// The scripts run under /bin/sh -c in the sandbox with the checkout's path
// as $1. They are constants: callers' values arrive only as positional
// parameters and environment variables, never as script text.

// prelude enters the checkout, finds the base commit, and keeps git from
// running anything the repository configures for display (external diff,
// textconv, pagers) or from printing in colour.
const prelude = `set -e
command -v git >/dev/null 2>&1 || { echo "git is not installed in the sandbox" >&2; exit 6; }
[ -d "$1" ] || { echo "no directory $1 in the sandbox" >&2; exit 3; }
cd "$1"
export GIT_PAGER=cat GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0
g() { git -c safe.directory='*' -c color.ui=false -c core.quotePath=false "$@"; }
g rev-parse --verify -q HEAD >/dev/null 2>&1 || { echo "$1 is not a git repository with a commit" >&2; exit 5; }
gd=$(g rev-parse --absolute-git-dir)
base() {
	if [ -f "$gd/berth-base" ]; then
		b=$(head -n1 "$gd/berth-base")
		if g rev-parse --verify -q "$b^{commit}"; then return 0; fi
	fi
	g merge-base HEAD '@{upstream}' 2>/dev/null ||
		g merge-base HEAD refs/remotes/origin/HEAD 2>/dev/null ||
		g rev-parse HEAD
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Stage everything in a scratch index: the user's index stays as it is.
scratch() {
	# -p keeps the mtime git uses to spot racily-clean entries.
	if [ -f "$gd/index" ]; then cp -p "$gd/index" "$tmp/index"; fi
	GIT_INDEX_FILE="$tmp/index" g add -A
}
`

const diffScript = `
b=$(base)
scratch
GIT_INDEX_FILE="$tmp/index" g diff --cached --binary --no-ext-diff --no-textconv --src-prefix=a/ --dst-prefix=b/ "$b" >"$tmp/out"
cat "$tmp/out"
`

// patchScript: the commits base..HEAD, then the uncommitted work as a
// commit object no ref points to (nothing in the repository changes).
const patchScript = `
b=$(base)
g format-patch --stdout --binary --no-signature --src-prefix=a/ --dst-prefix=b/ "$b..HEAD" >"$tmp/out"
scratch
tree=$(GIT_INDEX_FILE="$tmp/index" g write-tree)
if [ "$tree" != "$(g rev-parse 'HEAD^{tree}')" ]; then
	c=$(echo "Uncommitted changes" | g commit-tree "$tree" -p HEAD)
	g format-patch --stdout --binary --no-signature --src-prefix=a/ --dst-prefix=b/ -1 "$c" >>"$tmp/out"
fi
cat "$tmp/out"
`

const bundleScript = `
b=$(base)
if [ "$(g rev-list --count "$b..HEAD")" = 0 ]; then
	echo "no commits since the base $b: commit the work first (berth commit)" >&2
	exit 4
fi
refs=HEAD
if br=$(g symbolic-ref -q HEAD); then refs="$refs $br"; fi
g bundle create -q "$tmp/out.bundle" $refs "^$b" >&2
cat "$tmp/out.bundle"
`

// commitScript: $2 message, $3 branch (may be empty). Prints the commit
// and the branch.
const commitScript = `
if [ -n "$3" ] && [ "$(g symbolic-ref -q --short HEAD || true)" != "$3" ]; then
	g switch -q -c "$3" >&2
fi
g add -A
if g diff --cached --quiet; then
	echo "nothing to commit in $1" >&2
	exit 4
fi
g commit -q --no-verify -m "$2" >&2
g rev-parse HEAD
g symbolic-ref -q --short HEAD || true
`
