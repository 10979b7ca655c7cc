package main

import (
	"encoding/json"
	"os"
)

// output is everything a run measured: the -json file and the report's input.
type output struct {
	Params      params          `json:"params"`
	Addrs       []string        `json:"workers,omitempty"` // w0, w1, ... in order
	Walkthrough []step          `json:"walkthrough,omitempty"`
	Policies    []*policyResult `json:"policies,omitempty"`
	Sweep       []*sweepPoint   `json:"sweep,omitempty"`
	Overhead    *overheadResult `json:"overhead,omitempty"`
	WallSeconds float64         `json:"wall_seconds"`
	Notes       []string        `json:"notes,omitempty"` // the table's footnotes
}

// writeJSON writes out as indented JSON.
func writeJSON(path string, out *output) error {
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
