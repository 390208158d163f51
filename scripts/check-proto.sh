#!/usr/bin/env bash
# Fails if the generated Go code under proto/ is not what proto/gen.sh
# makes from the .proto files: regenerates into a temporary directory (the
# pinned buf and plugins, see proto/gen.sh) and compares, file by file,
# without touching the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./proto/gen.sh -o "$out"
status=0
# Every file the generator writes must be committed as it is written...
while IFS= read -r f; do
	if ! cmp -s "$out/$f" "proto/$f"; then
		echo "proto/$f differs from what proto/gen.sh generates:" >&2
		diff -u "proto/$f" "$out/$f" >&2 || true
		status=1
	fi
done < <(cd "$out" && find . -type f | sed 's|^\./||' | sort)
# ...and no generated file may be left over from a message or service
# that is gone.
while IFS= read -r f; do
	if [ ! -e "$out/$f" ]; then
		echo "proto/$f is not generated any more: remove it" >&2
		status=1
	fi
done < <(cd proto && find . -type f \( -name '*.pb.go' -o -name '*.connect.go' \) | sed 's|^\./||' | sort)
if [ "$status" -ne 0 ]; then
	echo "run ./proto/gen.sh and commit the result" >&2
	exit 1
fi
echo "proto: generated code is up to date"
