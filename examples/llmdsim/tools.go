//go:build tools

package llmdsim

import _ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
