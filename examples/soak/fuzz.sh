#!/usr/bin/env bash
# fuzz.sh — run every fuzz target of the module for a while (`go test` runs only their seed
# corpora). New failing inputs land in <package>/testdata/fuzz/<target>/: commit them with the
# fix, they become regression seeds.
#
#   examples/soak/fuzz.sh          # 60s per target
#   examples/soak/fuzz.sh 10m      # 10 minutes per target
#   examples/soak/fuzz.sh 10s ./tree FuzzForest
#
# A target fails when Go's fuzzer writes a failing input, or exits non-zero for any reason but
# one: Go 1.26's coordinator can report "context deadline exceeded" when -fuzztime runs out,
# having found nothing (golang/go#75804, fixed in Go 1.27). Such a run, with no input written,
# nothing being minimized and no failing seed, is tried once more, and if it happens again it
# is reported and counted, not failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
TIME=${1:-60s}
shift || true
if [ $# -ne 0 ] && [ $# -ne 2 ]; then
	echo "usage: $0 [DURATION [PACKAGE TARGET]]" >&2
	exit 2
fi

targets=()
if [ $# -eq 2 ]; then
	targets=("$1 $2")
else
	for pkg in ./kvroute/llmreq ./kvroute/telemetry ./kvroute/cluster ./kvroute ./tree ./caddyfile ./energy ./examples/llmsim ./examples/replay; do
		names=$(go test "$pkg" -list '^Fuzz') # a package that does not build stops the script here
		for target in $(grep '^Fuzz' <<<"$names" || true); do
			targets+=("$pkg $target")
		done
	done
fi
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzzing: no fuzz target found" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# newInputs lists the files under the target's corpus directory that git does not know.
newInputs() { # package target
	local f
	for f in "$1/testdata/fuzz/$2"/*; do
		if [ -f "$f" ] && ! git ls-files --error-unmatch "$f" >/dev/null 2>&1; then
			echo "$f"
		fi
	done
}

# run fuzzes one target and prints pass, flake or fail. KVROUTE_TEST_LOG=stderr: ./kvroute's
# tests send stderr to a hidden file for Caddy's log, and with it the fuzzer's progress and its
# "minimizing" lines, which the flake check reads (no Caddy starts with -run '^$').
run() { # package target
	if KVROUTE_TEST_LOG=stderr go test "$1" -run '^$' -fuzz "^$2\$" -fuzztime "$TIME" -fuzzminimizetime 5s >"$log" 2>&1; then
		echo pass
	elif [ -z "$(newInputs "$1" "$2")" ] && grep -q 'context deadline exceeded' "$log" &&
		! grep -q -e 'Failing input written to' -e 'minimizing' -e '^panic:' -e 'hung or terminated' \
			-e "--- FAIL: $2/" "$log"; then
		echo flake
	else
		echo fail
	fi
}

passed=0 flaked=0
for t in "${targets[@]}"; do
	read -r pkg target <<<"$t"
	echo "fuzz $pkg $target ($TIME)"
	result=$(run "$pkg" "$target")
	if [ "$result" = flake ]; then
		echo "  Go's fuzzer stopped with \"context deadline exceeded\" and no input (golang/go#75804); again"
		result=$(run "$pkg" "$target")
	fi
	case $result in
	pass) passed=$((passed + 1)) ;;
	flake)
		echo "  the same twice: counted as Go's flake, not as a failure"
		flaked=$((flaked + 1))
		;;
	*)
		tail -n 60 "$log"
		for f in $(newInputs "$pkg" "$target"); do
			echo "--- $f"
			head -c 4096 "$f"
			echo
		done
		echo "fuzzing: $pkg $target FAILED"
		exit 1
		;;
	esac
done
echo "fuzzing: ${#targets[@]} targets, $passed passed, $flaked stopped twice by Go's deadline flake, no failure"
