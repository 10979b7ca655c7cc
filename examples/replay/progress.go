package replay

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// showProgress starts rewriting a progress line on Options.Progress every 250ms and returns
// the function that stops it (and ends the line). Without a Progress writer it does nothing.
func (r *runner) showProgress() (stop func()) {
	if r.opts.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprint(r.opts.Progress, "\r"+r.progressLine())
			case <-quit:
				fmt.Fprint(r.opts.Progress, "\r"+r.progressLine()+"\n")
				return
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
	}
}

// progressLine renders the bar and the running figures.
func (r *runner) progressLine() string {
	const width = 30
	total := max(1, len(r.records))
	done := int(r.done.Load())
	fill := width * done / total
	hit := 0.0
	if p := r.prompt.Load(); p > 0 {
		hit = 100 * float64(r.cached.Load()) / float64(p)
	}
	return fmt.Sprintf("[%s%s] %d/%d  errors %d  hit %.1f%%  in flight %d  %s ",
		strings.Repeat("=", fill), strings.Repeat(" ", width-fill), done, total,
		r.errors.Load(), hit, r.inFlight.Load(), time.Since(r.start).Truncate(time.Second))
}
