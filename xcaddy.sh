#!/usr/bin/env bash
# xcaddy.sh — build Caddy with kvroute, run the demo, run the tests.
#
#   ./xcaddy.sh build   build ./caddy with the plugin (and nothing else)
#   ./xcaddy.sh demo    build Caddy (plugin + benchmark-only peer policies), start a simulated
#                       LLM fleet, replay a workload once per policy and print the comparison
#                       (-replicas 3: behind 3 replicas and a front; installs nats-server)
#   ./xcaddy.sh test    run the test suite (unit, caddytest integration, and the built binary);
#                       the tests against real engines run when their binaries are set (below)
#   ./xcaddy.sh engines build the engines those tests run (llm-d's simulator; Ollama, CPU-only
#                       with cgo: minutes and a C/C++ compiler), kept by their pins, and print
#                       their exports: eval "$(./xcaddy.sh engines)" before ./xcaddy.sh test
#   ./xcaddy.sh sim -out DIR [-scenarios REGEXP] [-seeds N]   the fleet simulator's scorecard in
#                       virtual time: every scenario, seed and policy, written to
#                       DIR/scorecard.json; prints medians over the seeds (docs/simulator.md)
#   ./xcaddy.sh fuzz [DURATION]   fuzz every target for DURATION each (default 1m)
#   ./xcaddy.sh bench [REGEX]     Go benchmarks, -count 10, summarised by benchstat
#
# Everything it needs (xcaddy, benchstat) is installed with `go install`.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
MOD=github.com/kvroute/caddy-kvroute
PSEUDO=v0.0.0-00010101000000-000000000000
XCADDY_VERSION=${XCADDY_VERSION:-v0.4.5}
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
NATS_SERVER_VERSION=${NATS_SERVER_VERSION:-v2.15.2}
GOBIN=$(go env GOPATH)/bin
export PATH="$GOBIN:$PATH"

need_xcaddy() {
	if ! command -v xcaddy >/dev/null 2>&1; then
		echo "installing xcaddy $XCADDY_VERSION" >&2
		go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
	fi
}

# xbuild OUTPUT MODULE=DIR... builds Caddy with the given local modules. Each is named with a
# pseudo-version and replaced by its directory (--with MOD@v0.0.0-...=DIR): that works whether
# or not the module proxy knows the module (an unpublished one gets 403 or 404 from it).
xbuild() {
	local out=$1
	shift
	local with=()
	for w in "$@"; do
		with+=(--with "${w%%=*}@$PSEUDO=${w#*=}")
	done
	need_xcaddy
	local log
	log=$(mktemp)
	if ! xcaddy build "$CADDY_VERSION" --output "$out" "${with[@]}" >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		return 1
	fi
	rm -f "$log"
}

build() {
	echo "building ./caddy with $MOD" >&2
	xbuild "$ROOT/caddy" "$MOD=$ROOT"
	"$ROOT/caddy" list-modules | grep -E 'kv_cache_aware|llm_prompt|llm_feedback|admin.api.kvroute' >&2
}

build_demo() {
	echo "building ./caddy-demo with $MOD and the benchmark-only peer policies" >&2
	xbuild "$ROOT/caddy-demo" "$MOD=$ROOT" "$MOD/examples/peers=$ROOT/examples/peers"
}

# engines builds llm-d's simulator and Ollama with its tiny model for the tests that run them,
# each reused while its module's pin (go.mod and go.sum) is the same, and prints their
# KVROUTE_* exports on stdout (what it does, on stderr). llm-d's simulator goes to
# examples/llmdsim/bin; Ollama to ~/.cache/kvroute/ollama-PIN, outside the clone, so that a
# fresh clone (CI's) builds it once per pin. Ollama's build prints thousands of compiler
# warnings: they go to build.log beside it, shown only when the build fails.
engines() {
	local llmd=examples/llmdsim/bin/llm-d-inference-sim pin started
	pin=$(cat examples/llmdsim/go.mod examples/llmdsim/go.sum | sha256sum | cut -d' ' -f1)
	if [ -x "$llmd" ] && [ "$(cat "$llmd.pin" 2>/dev/null)" = "$pin" ]; then
		echo "reusing $llmd" >&2
	else
		started=$SECONDS
		(cd examples/llmdsim && go build -o bin/llm-d-inference-sim github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim) >&2
		echo "$pin" >"$llmd.pin"
		echo "built $llmd in $((SECONDS - started)) s" >&2
	fi
	# -O3 -march=native makes Ollama's prefill some ten times faster; the binary runs on the
	# machine that built it.
	pin=$(cat examples/ollama/go.mod examples/ollama/go.sum | sha256sum | cut -d' ' -f1)
	local dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/ollama-$pin"
	if [ -x "$dir/ollama" ]; then
		echo "reusing $dir/ollama" >&2
	else
		if ! command -v "${CC:-gcc}" >/dev/null 2>&1; then
			echo "building Ollama needs a C/C++ compiler (cgo; ${CC:-gcc} not found: e.g. apt-get install build-essential)" >&2
			return 1
		fi
		started=$SECONDS
		mkdir -p "$dir"
		echo "building Ollama into $dir (minutes; the compiler's output in $dir/build.log)" >&2
		if ! (cd examples/ollama && CGO_ENABLED=1 CGO_CFLAGS="-O3 -march=native" CGO_CXXFLAGS="-O3 -march=native" \
			go build -o "$dir/ollama.tmp" github.com/ollama/ollama) >"$dir/build.log" 2>&1; then
			tail -n 30 "$dir/build.log" >&2
			return 1
		fi
		mv "$dir/ollama.tmp" "$dir/ollama"
		echo "built $dir/ollama in $((SECONDS - started)) s" >&2
	fi
	# The tiny model is written anew (seconds; the same seed, the same bytes).
	(cd examples/ollama && go run ./cmd/tinymodel -o "$dir/tiny.gguf") >&2
	printf 'export KVROUTE_LLMD_BIN=%q KVROUTE_OLLAMA_BIN=%q KVROUTE_OLLAMA_MODEL=%q\n' \
		"$ROOT/$llmd" "$dir/ollama" "$dir/tiny.gguf"
}

# engine_tests_not_run says which tests against real engines skip in this environment: the
# engines they need are neither set nor built where the tests look. Empty when all run.
engine_tests_not_run() {
	local not=()
	if [ -z "${KVROUTE_OLLAMA_BIN:-}" ]; then
		not+=("TestBinaryOllama and examples/ollamafleet's TestTinyModelServes (no KVROUTE_OLLAMA_BIN)")
	fi
	if [ -z "${KVROUTE_LLMD_BIN:-}" ] && [ ! -x examples/llmdsim/bin/llm-d-inference-sim ]; then
		not+=("TestFeedbackLlmdSimulator, TestDisaggregateLlmdSimulator and kvroute/telemetry's TestLlmdSimulatorLive (no KVROUTE_LLMD_BIN)")
	fi
	local out="" n
	for n in "${not[@]}"; do
		out+="${out:+; }$n"
	done
	echo "$out"
}

# failing_tests LOG lists, from go test's output, each failed package with the tests that failed
# in it (a test, then its failed subtests); a package that failed without naming a test
# panicked, timed out or did not build.
failing_tests() {
	awk '
		/^[ \t]*--- FAIL: / {
			name = $0
			sub(/^[ \t]*--- FAIL: /, "", name)
			sub(/ \([0-9.]+s\)$/, "", name)
			names = names "\n    " name
			next
		}
		/^FAIL[ \t]+[^ \t]/ {
			printf "  %s%s\n", $2, (names == "" ? ": no test named (a panic, a timeout or a build failure: see its output)" : names)
			names = ""
			next
		}
		/^ok[ \t]/ { names = "" }
	' "$1"
}

cmd=${1:-}
shift || true
case "$cmd" in
build)
	build
	;;
demo)
	if [ -d "$ROOT/examples/peers" ]; then
		build_demo
		CADDY_BIN="$ROOT/caddy-demo"
	else
		build
		CADDY_BIN="$ROOT/caddy"
	fi
	extra=()
	for a in "$@"; do
		if [[ $a == -replicas* || $a == --replicas* ]]; then
			# The replicas' cluster needs a NATS server: the binary, since importing
			# nats-server would put its requirements into the demo's module.
			if ! command -v nats-server >/dev/null 2>&1; then
				echo "installing nats-server $NATS_SERVER_VERSION" >&2
				go install "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION"
			fi
			extra=(-nats-server "$(command -v nats-server)")
		fi
	done
	go run ./examples/cmd/demo -caddy "$CADDY_BIN" "${extra[@]}" "$@"
	;;
test)
	build
	export KVROUTE_CADDY="$ROOT/caddy"
	# Every module is vetted and tested, whatever failed before it (examples/* with a go.mod,
	# and kvroute/cluster/clustertest, which embeds a NATS server, are modules of their own);
	# one summary line at the end, and a non-zero exit if any
	# module failed.
	# go test's output is kept too, so that the summary can end with the failing tests' names
	# (a failing package prints all its output, thousands of lines).
	passed=() failed=() vetfailed=()
	out=$(mktemp)
	trap 'rm -f "$out"' EXIT
	test_module() { # DIR GO-TEST-FLAGS...
		local dir=$1 ok=1
		shift
		echo "== $dir" >&2
		(cd "$dir" && go vet ./...) || { ok=0; vetfailed+=("$dir"); }
		(cd "$dir" && go test -race -count 1 "$@" ./... 2>&1) | tee -a "$out" || ok=0
		if ((ok)); then passed+=("$dir"); else failed+=("$dir"); fi
	}
	# -p 1 is no longer for ports (every test takes free ones: packages, and two runs on one
	# machine, never meet on one) but for the CPU: some kvroute tests bound latencies and
	# timings (the flood's decision p90, reloads under traffic, telemetry's queue) and fail on
	# a small machine when other test binaries run beside them.
	notrun=$(engine_tests_not_run)
	if [ -n "$notrun" ]; then
		echo "skipped, no engine to run them: $notrun; eval \"\$(./xcaddy.sh engines)\" builds them (Ollama: minutes and a C/C++ compiler)" >&2
	fi
	test_module . -p 1 "$@"
	for mod in examples/*/go.mod kvroute/cluster/clustertest/go.mod; do
		test_module "$(dirname "$mod")" "$@"
	done
	if ((${#failed[@]})); then
		echo
		echo "xcaddy.sh test: FAIL in ${#failed[@]} of $((${#passed[@]} + ${#failed[@]})) modules: ${failed[*]}${passed:+ (passed: ${passed[*]})}"
		if ((${#vetfailed[@]})); then
			echo "go vet failed in: ${vetfailed[*]}"
		fi
		echo "failing tests, by package:"
		failing_tests "$out"
		if [ -n "$notrun" ]; then
			echo "skipped, no engine to run them: $notrun"
		fi
		exit 1
	fi
	if [ -n "$notrun" ]; then
		echo "xcaddy.sh test: PASS, all ${#passed[@]} modules: ${passed[*]}; SKIPPED, no engine to run them: $notrun; eval \"\$(./xcaddy.sh engines)\" builds them (Ollama: minutes and a C/C++ compiler)"
	else
		echo "xcaddy.sh test: PASS, all ${#passed[@]} modules: ${passed[*]}; the tests against real engines ran (llm-d's simulator, Ollama)"
	fi
	;;
sim)
	go run ./examples/cmd/fleetsim "$@"
	;;
engines)
	engines
	;;
fuzz)
	examples/soak/fuzz.sh "$@"
	;;
bench)
	command -v benchstat >/dev/null 2>&1 || go install golang.org/x/perf/cmd/benchstat@latest
	out=$(mktemp)
	go test -run '^$' -bench "${1:-.}" -benchmem -count 10 ./tree/ ./kvroute/... ./energy/ | tee "$out"
	benchstat "$out"
	;;
*)
	sed -n "2,18p" "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
