package solver

// Chen's algorithms (T. Chen, B. Xu, C. Zhang, C. Guestrin, "Training Deep
// Nets with Sublinear Memory Cost", arXiv:1604.06174, 2016).
//
// √N (§4.1): cut the chain into segments of ⌈√L⌉ stages; the first
// forward keeps only each segment's input, and each segment is recomputed
// with its tapes right before its backward. Memory O(√L) activations plus
// one segment's tapes, one extra forward.
//
// Greedy memory planning (§4.2, Algorithm 3): walk the stages adding up
// their tapes and start a new segment whenever the sum passes a threshold
// x. Chen searches x; here every distinct sum of consecutive tapes is a
// candidate (O(L²) thresholds), each schedule is replayed (O(L)), and the
// cheapest that fits wins. A tiny example: four stages with tapes 1, 2, 1,
// 2 give the thresholds 1 to 6; with x = 3 the sum passes x at stage 2
// (1 + 2 + 1 = 4), so the segments are stages 0–2 and stage 3.
//
// Both are baselines: they recompute whole segments once, and Optimal
// replays them so that it is never worse than either.

import (
	"encoding/binary"
	"iter"
	"slices"

	"github.com/ckptplan/ckptplan/mem"
)

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
func ChenGreedy(c *Chain, budget mem.Bytes) (Schedule, bool) {
	var best, smallest Schedule
	bestCost, smallestPeak := 0.0, mem.Bytes(-1)
	for s := range chenSchedules(c) {
		r, err := replay(c, s, false)
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

// chenSchedules yields the distinct schedules of the greedy heuristic,
// one per segmentation some threshold gives, in order of threshold, each
// made when it is asked for.
func chenSchedules(c *Chain) iter.Seq[Schedule] {
	return func(yield func(Schedule) bool) {
		seen := map[string]bool{}
		var key []byte
		starts := []int{0}
		prev := mem.Bytes(-1)
		for _, th := range chenThresholds(c) {
			if th == prev {
				continue
			}
			prev = th
			starts, key = starts[:1], key[:0]
			var acc mem.Bytes
			for i := 0; i < c.Len(); i++ {
				acc += c.TapeBytes[i]
				if acc > th && i+1 < c.Len() {
					starts = append(starts, i+1)
					key = binary.AppendUvarint(key, uint64(i+1))
					acc = 0
				}
			}
			if seen[string(key)] {
				continue
			}
			seen[string(key)] = true
			if !yield(Segments(c, starts)) {
				return
			}
		}
	}
}

func chenThresholds(c *Chain) []mem.Bytes {
	var out []mem.Bytes
	for a := 0; a < c.Len(); a++ {
		var acc mem.Bytes
		for b := a; b < c.Len(); b++ {
			acc += c.TapeBytes[b]
			out = append(out, acc)
		}
	}
	slices.Sort(out)
	return out
}
