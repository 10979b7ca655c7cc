//go:build tools

package ollama

import _ "github.com/ollama/ollama"
