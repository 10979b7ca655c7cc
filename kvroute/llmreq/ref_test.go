package llmreq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// refParse is a slow reference for Parse on complete bodies, written from the package
// documentation with encoding/json. ok is false when encoding/json rejects the body (Parse is
// more lenient inside strings) or the body nests deeper than Parse accepts.
func refParse(body []byte) (req Request, ok bool) { return refParseAs(body, None) }

// refParseAs is refParse for ParseAs.
func refParseAs(body []byte, hint Format) (req Request, ok bool) {
	defer func() { req.Runes = utf8.RuneCountInString(req.Text) }()
	if !json.Valid(body) || nesting(body) > MaxDepth {
		return Request{}, false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		return Request{}, true // valid JSON, not an object
	}
	str := func(raw json.RawMessage) (string, bool) {
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	}
	req.Model, _ = str(top["model"])
	req.Session, _ = str(top["prompt_cache_key"])
	req.PreviousResponseID, _ = str(top["previous_response_id"])
	req.Stream = string(top["stream"]) == "true"
	switch {
	case refTokens(top["max_completion_tokens"]) > 0:
		req.MaxTokens = refTokens(top["max_completion_tokens"])
	case refTokens(top["max_tokens"]) > 0:
		req.MaxTokens = refTokens(top["max_tokens"])
	case refTokens(top["max_output_tokens"]) > 0:
		req.MaxTokens = refTokens(top["max_output_tokens"])
	default:
		var sp map[string]json.RawMessage
		if raw := top["sampling_params"]; len(raw) > 0 && raw[0] == '{' && json.Unmarshal(raw, &sp) == nil {
			req.MaxTokens = refTokens(sp["max_new_tokens"])
		}
		if raw := top["options"]; req.MaxTokens == 0 && len(raw) > 0 && raw[0] == '{' && json.Unmarshal(raw, &sp) == nil {
			req.MaxTokens = refTokens(sp["num_predict"])
		}
	}
	ollama := false
	for _, k := range []string{"options", "keep_alive", "format", "think", "template", "raw", "images", "context"} {
		_, ok := top[k]
		ollama = ollama || ok
	}
	defer func() {
		if req.Format == OllamaChat || req.Format == OllamaGenerate {
			req.Stream = string(top["stream"]) != "false"
		}
	}()
	_, anthropic := top["anthropic_version"]
	anthropic = anthropic || hint == Messages
	if _, ok := top["stop_sequences"]; ok {
		anthropic = true
	}
	first := func(raw json.RawMessage) byte {
		if len(raw) == 0 {
			return 0
		}
		return raw[0]
	}
	// What comes ahead of the conversation: a system prompt, then the tool definitions.
	head := func(sys string, hasSys bool) string {
		var sb strings.Builder
		if hasSys {
			sb.WriteString("system\x1f" + sys + "\x1e")
		}
		if first(top["tools"]) == '[' {
			sb.WriteString("tools\x1f" + string([]rune(string(top["tools"]))) + "\x1e")
		}
		return sb.String()
	}
	// items is the text of a messages array, or of a Responses input array.
	items := func(raw json.RawMessage) (text string, objects bool) {
		var sb strings.Builder
		var msgs []json.RawMessage
		json.Unmarshal(raw, &msgs)
		for _, raw := range msgs {
			var m map[string]json.RawMessage
			if first(raw) != '{' || json.Unmarshal(raw, &m) != nil {
				continue
			}
			objects = true
			output := refContent(m["output"], 0, &anthropic)
			summary := refContent(m["summary"], 0, &anthropic)
			_, hasRole := m["role"]
			if typ, ok := str(m["type"]); !hasRole && ok && typ != "message" {
				name, _ := str(m["name"])
				arg := func(raw json.RawMessage) string {
					if s, ok := str(raw); ok {
						return s
					}
					return string([]rune(string(raw)))
				}
				switch typ {
				case "function_call":
					sb.WriteString("assistant\x1f" + name + "(" + arg(m["arguments"]) + ")")
				case "custom_tool_call":
					sb.WriteString("assistant\x1f" + name + "(" + arg(m["input"]) + ")")
				case "function_call_output", "custom_tool_call_output":
					sb.WriteString("tool\x1f" + output)
				case "reasoning":
					content := refContent(m["content"], 0, &anthropic)
					sb.WriteString("reasoning\x1f" + strings.Join(nonEmpty(summary, content), "\n"))
				default:
					sb.WriteString(typ + "\x1f" + refPlaceholder(raw))
				}
				sb.WriteString("\x1e")
				continue
			}
			role, _ := str(m["role"])
			content := refContent(m["content"], 0, &anthropic)
			var calls []string
			var tc []json.RawMessage
			if first(m["tool_calls"]) == '[' {
				json.Unmarshal(m["tool_calls"], &tc)
			}
			for _, raw := range tc {
				var call, fn map[string]json.RawMessage
				if first(raw) != '{' || json.Unmarshal(raw, &call) != nil ||
					first(call["function"]) != '{' || json.Unmarshal(call["function"], &fn) != nil {
					continue
				}
				name, _ := str(fn["name"])
				args, ok := str(fn["arguments"])
				if !ok {
					args = string([]rune(string(fn["arguments"])))
				}
				calls = append(calls, name+"("+args+")")
			}
			sb.WriteString(role + "\x1f" + content)
			if len(calls) > 0 {
				if content != "" {
					sb.WriteString("\n")
				}
				sb.WriteString(strings.Join(calls, "\n"))
			}
			var images []json.RawMessage
			if first(m["images"]) == '[' {
				json.Unmarshal(m["images"], &images)
			}
			for i, e := range images {
				if i > 0 || content != "" || len(calls) > 0 {
					sb.WriteString("\n")
				}
				sb.WriteString(refPlaceholder(e))
			}
			sb.WriteString("\x1e")
		}
		return sb.String(), objects
	}
	if first(top["messages"]) == '[' {
		sys, hasSys := "", false
		if c := first(top["system"]); c == '"' || c == '[' {
			anthropic = true
			sys, hasSys = refContent(top["system"], 0, &anthropic), true
		}
		text, _ := items(top["messages"])
		req.Format = Chat
		if anthropic {
			req.Format = Messages
		} else if ollama || hint == OllamaChat {
			req.Format = OllamaChat
		}
		req.Text = head(sys, hasSys) + text
		return req, true
	}
	if prompt, ok := refPrompt(top["prompt"]); ok {
		c := first(top["system"])
		if hasSys := c == '"' || c == '['; ollama || hasSys || hint == OllamaGenerate {
			req.Format = OllamaGenerate
			if string(top["raw"]) == "true" {
				req.Text = prompt
				return req, true
			}
			var sb strings.Builder
			if first(top["context"]) == '[' {
				var ids []json.RawMessage
				json.Unmarshal(top["context"], &ids)
				var nums []string
				for _, id := range ids {
					if c := first(id); c == '-' || c >= '0' && c <= '9' {
						nums = append(nums, string(id))
					}
				}
				sb.WriteString("context\x1f" + strings.Join(nums, " ") + "\x1e")
			}
			if hasSys {
				sb.WriteString("system\x1f" + refContent(top["system"], 0, &anthropic) + "\x1e")
			}
			var images []json.RawMessage
			if first(top["images"]) == '[' {
				json.Unmarshal(top["images"], &images)
			}
			for _, e := range images {
				sb.WriteString("user\x1f" + refPlaceholder(e) + "\x1e")
			}
			sb.WriteString("user\x1f" + prompt + "\x1e")
			req.Text = sb.String()
			return req, true
		}
	}
	responses := hint == Responses
	for _, k := range []string{"instructions", "max_output_tokens", "previous_response_id", "reasoning", "include", "conversation", "truncation", "max_tool_calls"} {
		_, ok := top[k]
		responses = responses || ok
	}
	instr, hasInstr := str(top["instructions"])
	input, hasInput := str(top["input"])
	if hasInput {
		input = "user\x1f" + input + "\x1e"
	} else if first(top["input"]) == '[' {
		var objects bool
		input, objects = items(top["input"])
		hasInput, responses = true, responses || objects
	}
	if responses && (hasInput || hasInstr) {
		req.Format, req.Text = Responses, head(instr, hasInstr)+input
		return req, true
	}
	for _, f := range []struct {
		key    string
		format Format
	}{{"prompt", Completion}, {"text", Generate}, {"input_ids", Generate}} {
		if text, ok := refPrompt(top[f.key]); ok {
			req.Format, req.Text = f.format, text
			return req, true
		}
	}
	return req, true
}

// refPrompt is the text of a completion prompt or a /generate text: a string, or an array's
// strings, numbers and arrays of numbers; ok is false for any other value.
func refPrompt(raw json.RawMessage) (string, bool) {
	first := func(raw json.RawMessage) byte {
		if len(raw) == 0 {
			return 0
		}
		return raw[0]
	}
	var s string
	if first(raw) == '"' && json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	if first(raw) != '[' {
		return "", false
	}
	var elems []json.RawMessage
	json.Unmarshal(raw, &elems)
	var sb strings.Builder
	prev := byte(0)
	for _, e := range elems {
		kind := first(e)
		if kind == '-' || kind >= '0' && kind <= '9' {
			kind = '0'
		}
		if kind != '"' && kind != '0' && kind != '[' {
			continue
		}
		switch {
		case prev == '0' && kind == '0':
			sb.WriteString(" ")
		case prev != 0:
			sb.WriteString("\n")
		}
		prev = kind
		switch kind {
		case '"':
			var s string
			json.Unmarshal(e, &s)
			sb.WriteString(s)
		case '0':
			sb.Write(e)
		case '[':
			var ids []json.RawMessage
			json.Unmarshal(e, &ids)
			var nums []string
			for _, id := range ids {
				if c := first(id); c == '-' || c >= '0' && c <= '9' {
					nums = append(nums, string(id))
				}
			}
			sb.WriteString(strings.Join(nums, " "))
		}
	}
	return sb.String(), true
}

func refContent(raw json.RawMessage, level int, anthropic *bool) string {
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		json.Unmarshal(raw, &s)
		return s
	case '{':
		return refPart(raw, level, anthropic)
	case '[':
	default:
		return ""
	}
	var elems []json.RawMessage
	json.Unmarshal(raw, &elems)
	var parts []string
	for _, e := range elems {
		var s string
		switch e[0] {
		case '"':
			json.Unmarshal(e, &s)
		case '{':
			s = refPart(e, level, anthropic)
		}
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "\n")
}

func refPart(raw json.RawMessage, level int, anthropic *bool) string {
	var m map[string]json.RawMessage
	json.Unmarshal(raw, &m)
	var text, name, typ string
	hasText := false
	if t := m["text"]; len(t) > 0 && t[0] == '"' {
		json.Unmarshal(t, &text)
		hasText = true
	}
	if n := m["name"]; len(n) > 0 && n[0] == '"' {
		json.Unmarshal(n, &name)
	}
	t, typed := m["type"]
	if typed {
		typ = "\x00not a string"
		if len(t) > 0 && t[0] == '"' {
			json.Unmarshal(t, &typ)
		}
	}
	switch {
	case typ == "text" || typ == "input_text" || typ == "output_text" || typ == "summary_text" || typ == "reasoning_text" || !typed && hasText:
		return text
	case typ == "tool_use" || typ == "server_tool_use":
		*anthropic = true
		return name + "(" + string([]rune(string(m["input"]))) + ")"
	case typ == "tool_result":
		*anthropic = true
		if level+1 < partLevels {
			return refContent(m["content"], level+1, anthropic)
		}
		return ""
	}
	return refPlaceholder(raw)
}

// refPlaceholder is the placeholder of a non-text part written as raw, as documented in
// appendPlaceholder.
func refPlaceholder(raw []byte) string {
	sum := crc32.Checksum(raw, crc32.MakeTable(crc32.Castagnoli))
	s := fmt.Sprintf("\uFFFC%08x", sum)
	want := max(8, len(raw)/64)
	seed := uint64(sum)<<32 | uint64(crc32.ChecksumIEEE(raw))
	for k := uint64(1); len(s) < 3+want; k++ {
		z := seed + k*0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for i := 0; i < 64 && len(s) < 3+want; i += 4 {
			s += string("0123456789abcdef"[z>>i&0xf])
		}
	}
	return s
}

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func refTokens(raw json.RawMessage) int {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		json.Unmarshal(raw, &s)
		if numberLen([]byte(s)) != len(s) {
			return 0
		}
		raw = json.RawMessage(s)
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || v < 1 || v > math.MaxInt32 || v != math.Trunc(v) {
		return 0
	}
	return int(v)
}

// nesting returns how deep the arrays and objects of a valid JSON body nest.
func nesting(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// prefixSafe reports whether a valid JSON body is one for which Parse promises that the Text of
// any truncation is a prefix of the full Text: no duplicate keys, and the top-level system or
// instructions, tools, and messages or input in this order.
func prefixSafe(body []byte) bool {
	dups, late := keyOrder(body)
	return !dups && !late
}

// textOrder gives the top-level keys whose text comes in this order: a key seen after one of a
// later group voids the prefix promise for truncated bodies.
// Ollama's /api/generate: raw decides whether the rest counts, then the context, the system
// prompt, the images and the prompt.
var textOrder = map[string]int{"raw": 1, "context": 2, "system": 3, "instructions": 3, "tools": 4, "messages": 5, "input": 5, "images": 6, "prompt": 7}

// promptRank is which of a completion's or generate request's text fields wins (higher first):
// a cut body that stops before a winning field routes on a losing one read before it.
var promptRank = map[string]int{"input_ids": 1, "text": 2, "prompt": 3}

// keyOrder reports whether an object of a valid JSON body has a key twice, and whether the
// top-level keys come out of their order in the text (textOrder), or a winning prompt field
// (promptRank) comes after a losing one.
func keyOrder(body []byte) (dups, lateSystem bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type container struct {
		keys    map[string]bool // nil for arrays
		wantKey bool
		last    int // the latest textOrder group seen (top level)
		lowest  int // the lowest promptRank seen (top level)
	}
	var stack []*container
	afterValue := func() {
		if len(stack) > 0 {
			stack[len(stack)-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return dups, lateSystem
		}
		if s, ok := tok.(string); ok && len(stack) > 0 {
			if top := stack[len(stack)-1]; top.keys != nil && top.wantKey {
				dups = dups || top.keys[s]
				if len(stack) == 1 {
					lateSystem = lateSystem || textOrder[s] > 0 && textOrder[s] < top.last
					top.last = max(top.last, textOrder[s])
					if r := promptRank[s]; r > 0 {
						lateSystem = lateSystem || top.lowest > 0 && r > top.lowest
						if top.lowest == 0 || r < top.lowest {
							top.lowest = r
						}
					}
				}
				top.keys[s] = true
				top.wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &container{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &container{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			afterValue()
		default:
			afterValue()
		}
	}
}
