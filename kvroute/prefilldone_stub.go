package kvroute

// prefillDone is called when the request's first content reaches the client (llm_feedback).
// The cost branch (issue 23) defines it in request.go: it takes the request's uncached prefill
// tokens out of its upstream's queued prefill work. This placeholder lets the feedback branch
// build alone; the merge deletes this file.
func (lr *llmRequest) prefillDone() {}
