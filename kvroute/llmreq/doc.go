// Package llmreq extracts what routing needs from an LLM inference request body: the API it is
// written for, the model, the routing text, the session key, the output budget and whether the
// response streams. The llm_prompt matcher, the kv_cache_aware policy and the benchmark peer
// policies share it. It imports only the standard library.
//
// ReadBody reads a bounded prefix of a request body and puts back a body that yields every
// original byte; Decode decodes that prefix when the body is gzip- or deflate-encoded (at most
// max bytes, safe against decompression bombs); Parse reads it in one pass. Body.Attempt gives
// each attempt of a reverse proxy the body again: all of it when ReadBody holds it whole, else a
// clean failure once part of it went upstream. Routable says which bodies are worth waiting for.
//
// # Formats
//
// The fields tell the format; ParseAs also takes a hint from the request's path and headers
// (Hint), which only labels what the fields leave open:
//
//   - messages, an array: OpenAI chat completions (Chat); Anthropic messages (Messages) when the
//     body also has a top-level system (string or array), anthropic_version or stop_sequences,
//     or a message has a tool_use or tool_result block, or the hint is Messages (the path ends
//     in /v1/messages, or an anthropic-version header is set); Ollama's /api/chat (OllamaChat)
//     when it has a field only Ollama has (above) or the hint is OllamaChat (the path ends in
//     /api/chat);
//   - else input (a string or an array) or instructions, with a field only the Responses API
//     has (instructions, max_output_tokens, previous_response_id, reasoning, include,
//     conversation, truncation, max_tool_calls), or an input item object, or the hint
//     Responses (the path ends in /v1/responses): OpenAI Responses (Responses). A bare
//     {"model","input"} elsewhere is an embeddings or moderation request;
//   - else prompt, with a top-level system or a field only Ollama has (options, keep_alive,
//     format, think, template, raw, images, context), or the hint OllamaGenerate (the path ends
//     in /api/generate): Ollama's /api/generate (OllamaGenerate);
//   - else prompt, a string or an array: OpenAI completions (Completion);
//   - else text, a string or an array, else input_ids: SGLang /generate (Generate);
//   - else None: an unrelated JSON object (its model, prompt_cache_key, token budget and stream
//     are still read), or anything that is not a JSON object (nothing is read).
//
// # Routing text
//
// Chat and Messages: Anthropic's top-level system first, as a message with role "system", then
// the tools definitions, as sent (the JSON of the array as written), as a message with role
// "tools" (chat templates render them ahead of the conversation), then every message in order,
// each written as
//
//	role U+001F content [ "\n" tool-calls ] U+001E
//
// so that the text of turn n+1 starts with the text of turn n, and a conversation reads the same
// through either API. The separators are control characters that JSON must escape, so prompts
// practically never contain them. A role that is not a string counts as "". The content is:
//
//   - a string: itself; null or another type: "";
//   - an array of parts (or a single part object): the non-empty contributions of its parts,
//     joined by "\n". A string part, or a part of type text, input_text or output_text (or
//     without a type but with a text field), gives its text; an Anthropic tool_use block gives
//     name(input), input being its JSON as written; a tool_result block gives the text of its
//     own content (one level deep); any other part (image, audio, file, document, thinking...)
//     gives U+FFFC and a run of lowercase hex digits drawn from a digest of the part's JSON
//     (the first 8 are its CRC-32C), one per 64 bytes of that JSON and at least 8: a part
//     weighs what it costs to prefill (a token, 4 chars, per 256 bytes: about what vision
//     encoders spend on a base64 photo), the same image matches whole, a different one does not.
//
// OpenAI tool calls (an assistant's tool_calls) give name(arguments) each, joined by "\n", with
// the arguments string unescaped (or written as is when it is inline JSON); a call without a
// function object gives nothing.
//
// Responses: the instructions as a system message, the tools as above, then the input: a
// string as one user message; an array's items in order. An item with a role, or of type
// message, or without a type, reads as a chat message (input_text, output_text, summary_text
// and reasoning_text parts are text); a function_call (custom_tool_call) as the assistant's
// name(arguments) (name(input)); a function_call_output (custom_tool_call_output) as a tool
// message of its output; a reasoning item as role "reasoning" with its summary and content
// texts; any other item (item_reference, web_search_call...) as its type and the placeholder
// of its JSON. A follow-up that names previous_response_id carries only its new input: it is
// routed by its session (prompt_cache_key), which such clients should send.
//
// Ollama's messages may carry images (base64 strings): after the content and the tool calls,
// each image's placeholder, joined by "\n". OllamaGenerate, as Ollama's template sees it: the
// context (an earlier answer's token ids, joined by " ") as a message of role "context", the
// system prompt as a system message, each image as a user message, then the prompt as a user
// message, so that {"system":S,"prompt":P} reads as the chat [system S, user P]; with raw true
// the text is the prompt alone. Ollama's options.num_predict is the token budget when no
// max_tokens is given, and its own API streams unless stream is false.
//
// Completion and Generate: the prompt (or text, or input_ids) string; for an array, its strings, numbers
// (token ids, as written) and arrays of numbers (token id lists, ids joined by " ") are joined
// by "\n", except that two numbers in a row are joined by " ". Other elements are skipped.
//
// Strings are unescaped as encoding/json does (\uXXXX with surrogate pairs, a lone surrogate and
// each byte of invalid UTF-8 become U+FFFD), so the text is valid UTF-8. Parse is more lenient
// than encoding/json inside strings: an invalid escape is kept as written and control
// characters are kept.
//
// # Truncated bodies
//
// A body cut at the read limit is parsed as far as it goes: the model if seen, the messages read
// so far, the partial text of the message being read. Parse leaves out of the text whatever the
// cut bytes could still change: half an escape or UTF-8 sequence, half a token id, a message
// whose role is not read yet, a part whose type is not read yet, a message's tool calls while
// its content (which comes first in the text) is not read yet, a Responses item without a role
// until it is read whole. The text of a cut body is thus a prefix of the text of the whole body,
// provided no object has a key twice (Parse keeps the last one, as the Python servers do) and
// the top-level fields come in the order of the text: system or instructions, then tools, then
// messages or input (Ollama's generate: raw, context, system, images, prompt). SDKs send keys in the order the caller wrote them, and callers often put
// tools last: a body cut at the read limit then routes without its tools, whose text comes
// first. A cut body with only Anthropic's system, or only tools, read so far is a chat request
// (Messages, or Responses, as its fields and hint say).
//
// # Bad input
//
// Parse never panics, and its memory is bounded: the text is at most 4 times the size of the
// body. A body that is not a JSON object, is cut while truncated is false, has trailing bytes,
// or nests deeper than 1000 levels gives the zero Request. Token budgets that are not a whole
// number in [1, 2^31-1] (1e309, -5, 12.5) count as absent; a string holding one ("12") counts,
// as Python servers coerce it. Strings are kept whole however long (a session id of a
// megabyte): bounding them is the caller's business.
//
// # Performance
//
// Parse is a purpose-built single-pass scanner: values routing does not need are skipped without
// copying, strings are unescaped in runs found 8 bytes at a time, scratch buffers are pooled,
// and a parse allocates only its results (the text, the model, the session id). Benchmarks and
// their figures: docs/benchmarks.md in the repository.
package llmreq
