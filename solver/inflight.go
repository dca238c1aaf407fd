package solver

// In-flight planning: a pipeline device runs a run of the chain's stages
// for many microbatches, and holds what each keeps between its forward
// and its backward for every microbatch in flight. A choice that keeps
// x bytes a microbatch costs x times the microbatches in flight, so the
// single-step schedules of Optimal are the wrong question; this file
// answers the right one for the per-stage family, where each stage's
// first forward stores its tape (with one of its keep sets) or keeps its
// output only (a checkpoint), and a checkpointed stage reruns once, right
// before its backward (PerStage's schedules: Hugging Face's, Megatron's
// and PyTorch's selective checkpointing all run this way).
//
// For one segment of stages i = 0…n−1 run from input bytes I, let kept_i
// be what stage i's choice keeps (its tape, or its output a_{i+1}), K_{<i}
// their sum before i and K the whole sum. A microbatch's memory is I +
// K_{<i} plus a local peak while stage i runs: fwd_i (its output or tape
// and transients) in the forward, bwd_i (its tape, recomputed or kept,
// δ_{i+1} and transients) in the backward, and I + K + the loss's
// transients at the loss. So one microbatch peaks at
//
//	P = I + max(max_i K_{<i} + max(fwd_i, bwd_i), K + loss)
//
// and holds H = I + K between forward and backward. An output sent and
// freed once the forward is done leaves H, and a stored last stage's tape
// in its backward. A device whose segments s have n_s microbatches in flight at
// most holds at most
//
//	Σ_s n_s·H_s + max_s (P_s − H_s),
//
// which is exactly its peak when one segment is in flight n times (the
// 1F1B schedule: n − 1 microbatches held while the n-th runs), and a
// bound otherwise (the interleaved schedule's segments are not all at
// their most in flight at once).
//
// SolveInFlight minimizes the extra work Σ extra_i under that bound by a
// dynamic program over Pareto fronts: within a segment the point after
// stage i is (K_{≤i}, Z_i = max_{j≤i} K_{<j} + local_j, cost), and
// a point no cheaper than another with no more K and no more Z is
// dropped; between segments it is (Σ n_s·H_s, max_s P_s − H_s, cost).
// Every schedule of the family is dominated by one the fronts keep, so
// the result is optimal for the family — exactly, with no rounding, as
// long as a front stays under MaxFront states (maxEndFront at a chunk's
// end); past it, the sizes are rounded up to a grain that doubles until
// the front fits, which keeps every kept plan within budget. Time
// O(F·C_i·log(F·C_i)) a stage to sort its candidates and O(F²) at worst
// to prune them, for fronts of F states and C_i choices of stage i.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/ckptplan/ckptplan/mem"
)

// Checkpoint, as a stage's choice, keeps only the stage's output in the
// forward and reruns it (storing its own tape) right before its backward.
const Checkpoint = -1

// Segment is a run of stages [From, To) one device runs for each
// microbatch.
type Segment struct {
	From, To int
	// InputBytes is what the device holds for a microbatch before the
	// segment's first stage runs: a_From as received, and the graph's
	// inputs its stages read; held until the microbatch's backward is done.
	InputBytes mem.Bytes
	// DropOutput: a_To is sent on and freed once the forward is done
	// (Megatron-LM deallocates it; no op of the segment saves it).
	DropOutput bool
	// Loss: the segment ends with the chain's loss.
	Loss bool
	// InFlight is the most microbatches of the segment the device holds
	// at once (at least 1).
	InFlight int
	// Choices lists, for each stage From+k, the ways its first forward may
	// run: Checkpoint, or k ≥ 0 for F_all with option k.
	Choices [][]int
}

// SegmentMemory is what one microbatch of a segment takes on its device.
type SegmentMemory struct {
	Held     mem.Bytes // from the end of its forward to the start of its backward
	Forward  mem.Bytes // the most while its forward runs
	Backward mem.Bytes // the most while its loss and backward run
}

// Peak is the most one microbatch takes alone.
func (m SegmentMemory) Peak() mem.Bytes { return max(m.Forward, m.Backward) }

// kept is what stage i keeps under choice c from its first forward to its
// backward.
func (c *Chain) kept(i, choice int) mem.Bytes {
	if choice == Checkpoint {
		return c.ActBytes[i+1]
	}
	return c.Option(i, choice).TapeBytes
}

// localForward is the most stage i adds to what is held before it while
// its first forward runs.
func (c *Chain) localForward(i, choice int) mem.Bytes {
	if choice == Checkpoint {
		return c.ActBytes[i+1] + c.ForwardTempBytes[i]
	}
	o := c.Option(i, choice)
	return o.TapeBytes + o.FAllTempBytes
}

// localBackward is the most stage i adds to what is held before it while
// its backward runs: its tape (kept, or rerun with its own tape), the
// gradient δ_{i+1} and the transients.
func (c *Chain) localBackward(i, choice int) mem.Bytes {
	if choice == Checkpoint {
		return c.ActBytes[i+1] + c.TapeBytes[i] + max(c.FAllTemp(i), c.BackwardTempBytes[i])
	}
	o := c.Option(i, choice)
	return o.TapeBytes + c.ActBytes[i+1] + o.BackwardTempBytes
}

// segmentBackward is localBackward of stage i within segment s: when the
// segment's output is freed once sent, a stored last stage's tape no
// longer holds it (a checkpointed one reruns it).
func (c *Chain) segmentBackward(s Segment, i, choice int) mem.Bytes {
	b := c.localBackward(i, choice)
	if s.DropOutput && i == s.To-1 && choice != Checkpoint {
		b -= c.ActBytes[s.To]
	}
	return b
}

// extra is the work choice adds to storing stage i whole.
func (c *Chain) extra(i, choice int) float64 {
	if choice == Checkpoint {
		return c.Forward[i]
	}
	return c.Option(i, choice).Backward - c.Backward[i]
}

// SegmentMemory returns what a microbatch of the segment takes when its
// stages run the given choices (one a stage, as in Segment.Choices).
func (c *Chain) SegmentMemory(s Segment, choices []int) SegmentMemory {
	var k, fwd, bwd mem.Bytes
	for j, ch := range choices {
		i := s.From + j
		fwd = max(fwd, k+c.localForward(i, ch))
		bwd = max(bwd, k+c.segmentBackward(s, i, ch))
		k += c.kept(i, ch)
	}
	if s.Loss {
		bwd = max(bwd, k+c.LossTempBytes)
	}
	held := s.InputBytes + k
	if s.DropOutput {
		held -= c.ActBytes[s.To]
	}
	return SegmentMemory{Held: held, Forward: s.InputBytes + fwd, Backward: s.InputBytes + bwd}
}

// SegmentExtra returns the work the choices add to storing every stage
// of the segment, for one microbatch.
func (c *Chain) SegmentExtra(s Segment, choices []int) float64 {
	var e float64
	for j, ch := range choices {
		e += c.extra(s.From+j, ch)
	}
	return e
}

// InFlightBound is the bound SolveInFlight keeps under the budget for
// segments whose microbatches take mem: Σ n_s·H_s + max_s (P_s − H_s).
func InFlightBound(segs []Segment, m []SegmentMemory) mem.Bytes {
	var w mem.Bytes
	q := mem.Bytes(math.MinInt64)
	for k, s := range segs {
		w += mem.Bytes(s.InFlight) * m[k].Held
		q = max(q, m[k].Peak()-m[k].Held)
	}
	return w + q
}

// MaxFront is the most states an in-flight front keeps exactly (past it
// sizes are rounded up); maxEndFront the most
// a chunk's front keeps at its end, where chunks' fronts multiply.
const (
	MaxFront    = 1 << 12
	maxEndFront = 1 << 9
)

// point is a state of a front: two sizes, a cost, and how it was reached.
type point struct {
	a, b   mem.Bytes
	cost   float64
	parent int32 // index in the previous front
	choice int32 // the stage's choice, or the index in the segment's front
}

// SolveInFlight returns the cheapest choices for the segments of one
// device (one slice of choices a segment) whose bound Σ n_s·H_s +
// max_s (P_s − H_s) fits the budget, or an *ErrInfeasible with the least
// bound of the family when none does.
func SolveInFlight(c *Chain, segs []Segment, budget mem.Bytes) ([][]int, error) {
	out, err := solveInFlight(c, segs, budget, false)
	var inf *ErrInfeasible
	if errors.As(err, &inf) {
		// The least bound of the family: the same fronts, unbounded.
		if least, err2 := solveInFlight(c, segs, math.MaxInt64/4, true); err2 == nil {
			inf.MinBudget = InFlightBound(segs, segmentMemories(c, segs, least))
		}
	}
	return out, err
}

func segmentMemories(c *Chain, segs []Segment, choices [][]int) []SegmentMemory {
	m := make([]SegmentMemory, len(segs))
	for k, s := range segs {
		m[k] = c.SegmentMemory(s, choices[k])
	}
	return m
}

// solveInFlight is SolveInFlight; leastBound picks the least bound
// instead of the least cost.
func solveInFlight(c *Chain, segs []Segment, budget mem.Bytes, leastBound bool) ([][]int, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(segs) == 0 {
		return nil, errors.New("no segments")
	}
	for _, s := range segs {
		if s.From < 0 || s.To > c.Len() || s.From >= s.To || len(s.Choices) != s.To-s.From || s.InFlight < 1 {
			return nil, fmt.Errorf("segment [%d, %d): bad bounds, choices or in-flight count", s.From, s.To)
		}
		for j, cs := range s.Choices {
			if len(cs) == 0 {
				return nil, fmt.Errorf("stage %d has no choices", s.From+j)
			}
			for _, ch := range cs {
				if ch != Checkpoint && (ch < 0 || ch >= c.NumOptions(s.From+j)) {
					return nil, fmt.Errorf("stage %d has no option %d", s.From+j, ch)
				}
			}
		}
	}
	// Each segment's front of (H, P − H) and its per-stage back pointers.
	type segFront struct {
		stages [][]point // front after each stage
		end    []point   // (H, P−H) at the end; parent indexes stages' last front
	}
	fronts := make([]segFront, len(segs))
	for k, s := range segs {
		var f segFront
		cur := []point{{parent: -1}} // a = K, b = Z
		for j, cs := range s.Choices {
			i := s.From + j
			// The states each choice leads to, in the order of the
			// front they come from: sorted as it is, but where adding
			// the choice's cost rounds two apart costs together.
			next := make([][]point, len(cs))
			for ci, ch := range cs {
				kept, extra := c.kept(i, ch), c.extra(i, ch)
				loc := max(c.localForward(i, ch), c.segmentBackward(s, i, ch))
				for pi, st := range cur {
					ns := point{a: st.a + kept, b: max(st.b, st.a+loc), cost: st.cost + extra, parent: int32(pi), choice: int32(ch)}
					if s.InputBytes+ns.b > budget {
						continue // one microbatch alone does not fit
					}
					next[ci] = append(next[ci], ns)
				}
			}
			cur = pruneMerged(next, MaxFront)
			f.stages = append(f.stages, cur)
			if len(cur) == 0 {
				break
			}
		}
		for pi, st := range cur {
			if len(f.stages) < len(s.Choices) {
				break
			}
			held := s.InputBytes + st.a
			if s.DropOutput {
				held -= c.ActBytes[s.To]
			}
			peak := s.InputBytes + st.b
			if s.Loss {
				peak = max(peak, s.InputBytes+st.a+c.LossTempBytes)
			}
			f.end = append(f.end, point{a: held, b: peak - held, cost: st.cost, parent: int32(pi)})
		}
		f.end = pruneTo(f.end, maxEndFront)
		fronts[k] = f
	}
	// Across segments: (Σ n·H, max P − H, cost).
	cur := []point{{b: mem.Bytes(math.MinInt64 / 4), parent: -1}}
	var levels [][]point
	for k, s := range segs {
		var next []point
		for pi, st := range cur {
			for ei, e := range fronts[k].end {
				ns := point{a: st.a + mem.Bytes(s.InFlight)*e.a, b: max(st.b, e.b), cost: st.cost + e.cost, parent: int32(pi), choice: int32(ei)}
				next = append(next, ns)
			}
		}
		cur = prune(next)
		levels = append(levels, cur)
	}
	best := -1
	for i, st := range cur {
		bound := st.a + st.b
		if bound > budget {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := cur[best]
		if leastBound && bound < b.a+b.b || !leastBound && (st.cost < b.cost || st.cost == b.cost && bound < b.a+b.b) {
			best = i
		}
	}
	if best < 0 {
		return nil, &ErrInfeasible{Budget: budget}
	}
	out := make([][]int, len(segs))
	idx := best
	for k := len(segs) - 1; k >= 0; k-- {
		st := levels[k][idx]
		e := fronts[k].end[st.choice]
		choices := make([]int, len(segs[k].Choices))
		j := int(e.parent)
		for l := len(choices) - 1; l >= 0; l-- {
			ss := fronts[k].stages[l][j]
			choices[l] = int(ss.choice)
			j = int(ss.parent)
		}
		out[k] = choices
		idx = int(st.parent)
	}
	return out, nil
}

// prune keeps the states no other point dominates (no larger a, no larger
// b, no larger cost; the first of equals), rounding a and b up to a
// doubling grain while more than MaxFront remain.
func prune(states []point) []point { return pruneTo(states, MaxFront) }

// pruneTo is prune keeping at most limit states. Rounding up keeps
// dominance, so each coarser pass prunes the last one's front.
func pruneTo(states []point, limit int) []point {
	return coarsen(paretoFront(states, 1), limit)
}

// coarsen prunes a front again at doubling grains while it has more than
// limit states.
func coarsen(out []point, limit int) []point {
	for grain := mem.Bytes(2); len(out) > limit; grain *= 2 {
		out = paretoFront(out, grain)
	}
	return out
}

// pruneMerged is pruneTo over the states of lists[0], lists[1], … taken
// in turns (the states of one parent, each choice's, then the next
// parent's), where each list is in its parents' front order: the order
// of a sort by cost, a and b where adding a choice's cost keeps costs
// apart. It merges the lists, a heap of their heads, instead of sorting
// them whole; a list that adding rounded out of order is sorted first.
// The front is the one pruneTo gives, state for state.
func pruneMerged(lists [][]point, limit int) []point {
	key := func(x, y point) int {
		switch {
		case x.cost != y.cost:
			return cmp.Compare(x.cost, y.cost)
		case x.a != y.a:
			return cmp.Compare(x.a, y.a)
		}
		return cmp.Compare(x.b, y.b)
	}
	n := 0
	for _, l := range lists {
		n += len(l)
		for i := 1; i < len(l); i++ {
			if key(l[i-1], l[i]) > 0 {
				slices.SortStableFunc(l, key)
				break
			}
		}
	}
	// A heap of the lists' heads; equal keys go by parent, then by list:
	// their order taken in turns.
	type head struct {
		point
		list int
	}
	less := func(x, y *head) bool {
		switch {
		case x.cost != y.cost:
			return x.cost < y.cost
		case x.a != y.a:
			return x.a < y.a
		case x.b != y.b:
			return x.b < y.b
		case x.parent != y.parent:
			return x.parent < y.parent
		}
		return x.list < y.list
	}
	heap := make([]head, 0, len(lists))
	down := func(h int) {
		for {
			m, l, r := h, 2*h+1, 2*h+2
			if l < len(heap) && less(&heap[l], &heap[m]) {
				m = l
			}
			if r < len(heap) && less(&heap[r], &heap[m]) {
				m = r
			}
			if m == h {
				return
			}
			heap[h], heap[m] = heap[m], heap[h]
			h = m
		}
	}
	next := make([]int, len(lists)) // each list's head
	for i, l := range lists {
		if len(l) > 0 {
			heap = append(heap, head{l[0], i})
		}
	}
	for h := len(heap)/2 - 1; h >= 0; h-- {
		down(h)
	}
	sorted := make([]point, 0, n)
	for len(heap) > 0 {
		top := &heap[0]
		sorted = append(sorted, top.point)
		i := top.list
		if next[i]++; next[i] < len(lists[i]) {
			top.point = lists[i][next[i]]
		} else {
			heap[0] = heap[len(heap)-1]
			heap = heap[:len(heap)-1]
		}
		down(0)
	}
	return coarsen(stairs(sorted), limit)
}

// paretoFront is prune at one grain.
func paretoFront(states []point, grain mem.Bytes) []point {
	up := func(v mem.Bytes) mem.Bytes {
		if grain == 1 {
			return v
		}
		return (v + grain - 1) / grain * grain
	}
	// By cost, then a, then b, then the order given (a stable sort, as
	// pdqsort over the positions: several times faster on the wide fronts
	// of costs in time): a point is kept unless an earlier kept one has
	// no larger a and no larger b.
	type ranked struct {
		point
		at int
	}
	in := make([]ranked, len(states))
	for i, s := range states {
		s.a, s.b = up(s.a), up(s.b)
		in[i] = ranked{s, i}
	}
	slices.SortFunc(in, func(x, y ranked) int {
		switch {
		case x.cost != y.cost:
			return cmp.Compare(x.cost, y.cost)
		case x.a != y.a:
			return cmp.Compare(x.a, y.a)
		case x.b != y.b:
			return cmp.Compare(x.b, y.b)
		}
		return cmp.Compare(x.at, y.at)
	})
	sorted := make([]point, len(in))
	for i, r := range in {
		sorted[i] = r.point
	}
	return stairs(sorted)
}

// stairs returns the states of sorted (by cost, then a, then b) that no
// earlier one dominates: a point is kept unless an earlier kept one has no
// larger a and no larger b.
func stairs(sorted []point) []point {
	var out []point
	// stair holds the kept (a, b) pairs with b strictly falling as a rises.
	var stair []point
	for _, s := range sorted {
		// The kept point with the largest a ≤ s.a has the least b among
		// those with a ≤ s.a.
		k := sort.Search(len(stair), func(i int) bool { return stair[i].a > s.a })
		if k > 0 && stair[k-1].b <= s.b {
			continue
		}
		out = append(out, s)
		// Insert s, dropping the stair points it dominates in (a, b).
		i, j := k, k
		for i > 0 && stair[i-1].a == s.a {
			i--
		}
		for j < len(stair) && stair[j].b >= s.b {
			j++
		}
		stair = slices.Replace(stair, i, j, s)
	}
	return out
}
