#!/usr/bin/env bash
# fuzz.sh — run every fuzz target of the module for a while (`go test` runs only their seed
# corpora). New failing inputs land in <package>/testdata/fuzz/<target>/: commit them with the
# fix, they become regression seeds.
#
#   examples/soak/fuzz.sh          # 60s per target
#   examples/soak/fuzz.sh 10m      # 10 minutes per target
#   examples/soak/fuzz.sh 10s ./tree FuzzForest
#
# A target fails when Go's fuzzer writes a failing input. A non-zero exit that only says
# "context deadline exceeded", with no input written, is Go's own flake at the -fuzztime
# boundary (golang/go#51484: a worker still busy when time runs out); it is reported and
# counted, not failed. Any other non-zero exit fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
TIME=${1:-60s}
shift || true

targets=()
if [ $# -ge 2 ]; then
	targets=("$1 $2")
else
	for pkg in ./kvroute/llmreq ./kvroute ./tree ./caddyfile ./energy ./examples/llmsim ./examples/replay; do
		for target in $(go test "$pkg" -list '^Fuzz' | grep '^Fuzz'); do
			targets+=("$pkg $target")
		done
	done
fi

passed=0 flaked=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
	read -r pkg target <<<"$t"
	echo "fuzz $pkg $target ($TIME)"
	# -fuzzminimizetime: minimizing a large new input can otherwise stall a worker for 60s.
	if go test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$TIME" -fuzzminimizetime 5s >"$log" 2>&1; then
		passed=$((passed + 1))
		continue
	fi
	if ! grep -q 'Failing input written to' "$log" && grep -q 'context deadline exceeded' "$log" &&
		! grep -q -e '^panic:' -e 'hung or terminated' "$log"; then
		echo "  flake: Go's fuzzer stopped at the -fuzztime boundary with no failing input (golang/go#51484)"
		flaked=$((flaked + 1))
		continue
	fi
	tail -n 60 "$log"
	dir="$pkg/testdata/fuzz/$target"
	for f in "$dir"/*; do
		if [ -f "$f" ] && ! git ls-files --error-unmatch "$f" >/dev/null 2>&1; then
			echo "--- $f"
			head -c 4096 "$f"
			echo
		fi
	done
	echo "fuzzing: $pkg $target FAILED"
	exit 1
done
echo "fuzzing: ${#targets[@]} targets, $passed passed, $flaked stopped by Go's deadline flake, no failure"
