package main

import (
	"encoding/json"
	"os"

	"github.com/kvroute/caddy-kvroute/examples/fleetsim"
)

// output is everything a run measured: the -json file and the report's input.
type output struct {
	Params      params          `json:"params"`
	Addrs       []string        `json:"workers,omitempty"` // w0, w1, ... in order
	Walkthrough []step          `json:"walkthrough,omitempty"`
	Policies    []*policyResult `json:"policies,omitempty"`
	Sweep       []*sweepPoint   `json:"sweep,omitempty"`
	Overhead    *overheadResult `json:"overhead,omitempty"`
	// The flow workloads (issue 35): each scenario's figures by class, and the targets.
	Flow        []*flowResult         `json:"flow,omitempty"`
	FlowTargets []fleetsim.FlowTarget `json:"flow_targets,omitempty"`
	WallSeconds float64               `json:"wall_seconds"`
	Notes       []string              `json:"notes,omitempty"` // the table's footnotes
}

// writeJSON writes out as indented JSON.
func writeJSON(path string, out *output) error {
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
