package kvroute

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/caddy-kvroute/energy"
	"github.com/kvroute/caddy-kvroute/kvroute/llmreq"
)

func init() {
	caddy.RegisterModule(new(LLMPrompt))
}

// LLMPrompt is the request matcher `llm_prompt`. It reads at most max_body bytes of the body
// (of decoded bytes, for a gzip or deflate body), restores the body byte for byte (bytes beyond
// the limit still stream through), and matches when the body is an LLM request (OpenAI chat
// completions, Responses or completions, Anthropic messages, SGLang generate) or carries a
// prompt_cache_key (routed by session), and its model fits one of the patterns, if any are
// given. What it extracts is
// cached in the request for the kv_cache_aware policy and set as placeholders:
// {http.vars.llm.model}, {http.vars.llm.session}, {http.vars.llm.prompt_chars},
// {http.vars.llm.max_tokens}, {http.vars.llm.stream}, {http.vars.llm.format}.
type LLMPrompt struct {
	// Bytes of body read for routing. Default: 4MiB.
	MaxBody int64 `json:"max_body,omitempty"`
	// Match only requests for these models (globs: '*' any run of chars, '?' one char).
	Models []string `json:"model,omitempty"`

	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*LLMPrompt) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.llm_prompt",
		New: func() caddy.Module { return new(LLMPrompt) },
	}
}

// Provision applies defaults.
func (m *LLMPrompt) Provision(ctx caddy.Context) error {
	m.logger = ctx.Logger()
	if m.MaxBody == 0 {
		m.MaxBody = DefaultMaxBody
	}
	return m.Validate()
}

// Validate checks the options.
func (m *LLMPrompt) Validate() error {
	if m.MaxBody < 0 {
		return fmt.Errorf("max_body: must be positive, got %d", m.MaxBody)
	}
	for _, p := range m.Models {
		if err := energy.ValidateModelPattern(p); err != nil {
			return fmt.Errorf("model: %w", err)
		}
	}
	return nil
}

// MatchWithError reads the request's LLM fields and reports whether it is an LLM request for
// one of the models. A body that cannot be read does not match; its error reaches whoever
// reads the body next.
func (m *LLMPrompt) MatchWithError(r *http.Request) (bool, error) {
	lr := requestFor(r, m.MaxBody)
	if lr.err != nil {
		if ce := m.logger.Check(zapcore.DebugLevel, "reading request body"); ce != nil {
			ce.Write(zap.Error(lr.err))
		}
	}
	if lr.Format == llmreq.None && lr.Session == "" {
		return false, nil
	}
	if len(m.Models) == 0 {
		return true, nil
	}
	return energy.MatchModel(m.Models, lr.Model), nil
}

// Match implements caddyhttp.RequestMatcher.
func (m *LLMPrompt) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// Interface guards.
var (
	_ caddyhttp.RequestMatcherWithError = (*LLMPrompt)(nil)
	_ caddy.Provisioner                 = (*LLMPrompt)(nil)
	_ caddy.Validator                   = (*LLMPrompt)(nil)
)
