package solver

import (
	"fmt"
	"sort"
)

// StoreAll returns the schedule that keeps every tape: F_all of every
// stage, the loss, then every backward. It has the least cost of all
// schedules and the largest memory.
func StoreAll(c *Chain) Schedule { return StoreAllWith(c, nil) }

// StoreAllWith is StoreAll with F_all(i) running option options[i] (nil:
// every option 0).
func StoreAllWith(c *Chain, options []int) Schedule {
	l := c.Len()
	s := make(Schedule, 0, 2*l+1)
	for i := 0; i < l; i++ {
		o := 0
		if options != nil {
			o = options[i]
		}
		s = append(s, Op{Kind: FAll, Stage: i, Option: o})
	}
	s = append(s, Op{Kind: Loss, Stage: l})
	for i := l - 1; i >= 0; i-- {
		s = append(s, Op{Kind: B, Stage: i})
	}
	return s
}

// Segments returns the schedule that keeps the input of each segment as a
// checkpoint in the first forward pass and recomputes a segment with tapes
// right before its backward. starts lists the first stage of every segment
// in increasing order, beginning with 0. The last segment keeps its tapes
// in the first pass (recomputing it would change nothing), as
// torch.utils.checkpoint_sequential does.
func Segments(c *Chain, starts []int) Schedule {
	l := c.Len()
	ends := append(append([]int(nil), starts[1:]...), l)
	var s Schedule
	last := len(starts) - 1
	for k := 0; k < last; k++ {
		s = append(s, Op{Kind: FCk, Stage: starts[k]})
		for i := starts[k] + 1; i < ends[k]; i++ {
			s = append(s, Op{Kind: FN, Stage: i})
		}
	}
	for k := last; k >= 0; k-- {
		for i := starts[k]; i < ends[k]; i++ {
			s = append(s, Op{Kind: FAll, Stage: i})
		}
		if k == last {
			s = append(s, Op{Kind: Loss, Stage: l})
		}
		for i := ends[k] - 1; i >= starts[k]; i-- {
			s = append(s, Op{Kind: B, Stage: i})
		}
	}
	return s
}

// EveryK checkpoints the input of every k-th stage (k = 1 is per-layer
// checkpointing as Hugging Face's gradient_checkpointing_enable does).
func EveryK(c *Chain, k int) Schedule {
	k = max(k, 1)
	var starts []int
	for i := 0; i < c.Len(); i += k {
		starts = append(starts, i)
	}
	return Segments(c, starts)
}

// Sqrt is Chen et al.'s √N strategy (Training Deep Nets with Sublinear
// Memory Cost, arXiv:1604.06174, §4.1): segments of ⌈√L⌉ stages.
func Sqrt(c *Chain) Schedule {
	k := 1
	for k*k < c.Len() {
		k++
	}
	return EveryK(c, k)
}

// ChenGreedy is Chen et al.'s memory-planning heuristic (§4.2, Algorithm
// 3): walk the stages adding up their tapes and start a new segment when
// the sum passes a threshold. Each candidate threshold (every distinct
// prefix sum of tape bytes) gives a schedule; the cheapest one that fits the
// budget is returned, else the one with the smallest peak and false.
// O(L²) schedules of O(L) ops each are simulated.
func ChenGreedy(c *Chain, budget int64) (Schedule, bool) {
	var best, smallest Schedule
	bestCost, smallestPeak := 0.0, int64(-1)
	seen := map[string]bool{}
	for _, th := range chenThresholds(c) {
		starts := []int{0}
		var acc int64
		for i := 0; i < c.Len(); i++ {
			acc += c.TapeBytes[i]
			if acc > th && i+1 < c.Len() {
				starts = append(starts, i+1)
				acc = 0
			}
		}
		key := fmt.Sprint(starts)
		if seen[key] {
			continue
		}
		seen[key] = true
		s := Segments(c, starts)
		r, err := Simulate(c, s)
		if err != nil {
			panic(err) // Segments always builds valid schedules
		}
		if smallestPeak < 0 || r.Peak < smallestPeak {
			smallest, smallestPeak = s, r.Peak
		}
		if r.Peak <= budget && (best == nil || r.Cost < bestCost) {
			best, bestCost = s, r.Cost
		}
	}
	if best == nil {
		return smallest, false
	}
	return best, true
}

func chenThresholds(c *Chain) []int64 {
	var out []int64
	for a := 0; a < c.Len(); a++ {
		var acc int64
		for b := a; b < c.Len(); b++ {
			acc += c.TapeBytes[b]
			out = append(out, acc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
