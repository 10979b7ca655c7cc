#!/usr/bin/env bash
# fuzz.sh — run every fuzz target of the module for a while (CI runs only their seed corpora,
# as part of `go test`). New failing inputs land in <package>/testdata/fuzz/<target>/: commit
# them with the fix, they become regression seeds.
#
#   examples/soak/fuzz.sh          # 60s per target
#   examples/soak/fuzz.sh 10m      # 10 minutes per target
set -euo pipefail
cd "$(dirname "$0")/../.."
TIME=${1:-60s}
for pkg in ./kvroute ./kvroute/llmreq ./tree; do
	for target in $(go test "$pkg" -list '^Fuzz' | grep '^Fuzz'); do
		echo "== $pkg $target ($TIME)" >&2
		# -fuzzminimizetime: minimizing a large new input can otherwise stall a worker for 60s.
		go test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$TIME" -fuzzminimizetime 5s
	done
done
