// Package llmdsim pins llm-d's vLLM simulator (github.com/llm-d/llm-d-inference-sim), which
// the demo runs as a second, independent fleet (`./xcaddy.sh demo -fleet llmd`). It is a
// module of its own so that the simulator's dependencies stay out of kvroute's go.mod. The
// demo builds the binary on first use; by hand:
//
//	cd examples/llmdsim && go build -o bin/llm-d-inference-sim github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim
package llmdsim
