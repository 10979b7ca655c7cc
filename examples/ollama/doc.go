// Package ollama pins Ollama (github.com/ollama/ollama v0.6.5), a real LLM engine that builds
// from its Go module, CPU-only with cgo, and writes the tiny model it serves in the tests and
// the demo: a llama of 4 layers, embedding 256 and random weights, with an SPM vocabulary of
// byte tokens and word pieces (25 MB), written with Ollama's own fs/ggml.WriteGGUF from a seed
// (WriteTinyModel: the same seed, the same bytes). It is a module of its own so that Ollama's
// dependencies stay out of kvroute's go.mod. .ci/run builds both and caches them by this
// module's go.mod and go.sum; by hand:
//
//	cd examples/ollama
//	CGO_ENABLED=1 CGO_CFLAGS='-O3 -march=native' CGO_CXXFLAGS='-O3 -march=native' \
//		go build -o bin/ollama github.com/ollama/ollama
//	go run ./cmd/tinymodel -o bin/tiny.gguf
//	export KVROUTE_OLLAMA_BIN=$PWD/bin/ollama
//
// (-O3 -march=native makes prefill some ten times faster than Go's default -O2; the binary then
// runs on CPUs like the one that built it.) The build takes minutes: some 2 on 2 idle cores.
//
// examples/ollamafleet runs instances side by side (each its own HOME, OLLAMA_MODELS and
// OLLAMA_HOST, OLLAMA_KEEP_ALIVE=-1, OLLAMA_NUM_PARALLEL, OLLAMA_MULTIUSER_CACHE=1 so that a
// slot keeps its prefix across unrelated prompts) and registers the model with each through
// the blobs API (POST /api/blobs/sha256:..., then POST /api/create), as `ollama create tiny -f
// Modelfile` does with this Modelfile:
//
//	FROM ./tiny.gguf
//	TEMPLATE """{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
//	{{ end }}<|assistant|>"""
//	PARAMETER num_ctx 8192
//	PARAMETER num_predict 16
//
// num_predict bounds answers whose request names no budget: a model of random weights
// practically never writes its end token.
package ollama
