package main

import (
	"strings"
	"testing"
)

// TestRefLines: the hit-ratio chart's reference and infinite lines never print their labels on
// top of each other: one label when they read the same, labels set off to either side when
// they are close.
func TestRefLines(t *testing.T) {
	x := func(v float64) float64 { return 230 + v*610 }
	if l := refLines(0.8512, 0.849, x); len(l) != 1 || l[0].text != "reference = infinite 0.85" {
		t.Errorf("equal: %+v", l)
	}
	l := refLines(0.80, 0.85, x) // 30 px apart
	if len(l) != 2 || l[0].anchor != "end" || l[1].anchor != "start" || !strings.HasPrefix(l[0].text, "reference 0.80") {
		t.Errorf("close: %+v", l)
	}
	if l := refLines(0.40, 0.85, x); len(l) != 2 || l[0].anchor != "middle" || l[1].anchor != "middle" {
		t.Errorf("apart: %+v", l)
	}
	chart := hitChart(nil)
	if strings.Count(chart, "reference") != 1 {
		t.Errorf("chart of no runs: %s", chart)
	}
}
