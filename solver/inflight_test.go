package solver

import (
	"errors"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// subChain is stages [from, to) of c as a chain of their own, ending with
// c's loss when loss is set and with a free one otherwise.
func subChain(c *Chain, from, to int, loss bool) *Chain {
	s := &Chain{
		Forward: c.Forward[from:to], Backward: c.Backward[from:to], ActBytes: c.ActBytes[from : to+1],
		TapeBytes: c.TapeBytes[from:to], ForwardTempBytes: c.ForwardTempBytes[from:to], BackwardTempBytes: c.BackwardTempBytes[from:to],
	}
	if c.FAllTempBytes != nil {
		s.FAllTempBytes = c.FAllTempBytes[from:to]
	}
	if c.Options != nil {
		s.Options = c.Options[from:to]
	}
	if loss {
		s.LossBackward, s.LossTempBytes = c.LossBackward, c.LossTempBytes
	}
	return s
}

// randomChoices draws a choice for each stage of [from, to).
func randomChoices(r *rand.Rand, c *Chain, from, to int) []int {
	ch := make([]int, to-from)
	for j := range ch {
		ch[j] = r.Intn(c.NumOptions(from+j)+1) - 1
	}
	return ch
}

// perStage is the PerStage schedule of choices.
func perStage(choices []int) Schedule {
	ck := make([]bool, len(choices))
	opts := make([]int, len(choices))
	for j, ch := range choices {
		ck[j] = ch == Checkpoint
		opts[j] = max(ch, 0)
	}
	return PerStage(ck, opts)
}

// TestSegmentMemoryReplays checks SegmentMemory against Simulate: a
// segment run alone from its input, its stages' choices as PerStage runs
// them, peaks where the replay does, and holds between forward and
// backward what the replay holds at the loss.
func TestSegmentMemoryReplays(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for k := 0; k < 5000; k++ {
		c := withOptions(r, randomChain(r, 1+r.Intn(6)))
		from := r.Intn(c.Len())
		to := from + 1 + r.Intn(c.Len()-from)
		loss := to == c.Len() && r.Intn(2) == 0
		choices := randomChoices(r, c, from, to)
		sub := subChain(c, from, to, loss)
		sched := perStage(choices)
		res, err := Simulate(sub, sched)
		if err != nil {
			t.Fatal(err)
		}
		got := c.SegmentMemory(Segment{From: from, To: to, InputBytes: c.ActBytes[from], Loss: loss, InFlight: 1}, choices)
		u := res.Usage[to-from]
		if held := u.Activations + u.Tapes; got.Held != held || got.Peak() != res.Peak {
			t.Fatalf("chain %+v, [%d, %d) %v: SegmentMemory %+v, replay holds %d and peaks at %d", c, from, to, choices, got, held, res.Peak)
		}
		if fwd := slicesMax(res.Timeline[:to-from]); got.Forward != fwd {
			t.Fatalf("chain %+v, [%d, %d) %v: forward peak %d, replay %d", c, from, to, choices, got.Forward, fwd)
		}
		if e, want := c.SegmentExtra(Segment{From: from, To: to}, choices), res.Cost-storeAllCost(sub); e != want {
			t.Fatalf("extra %v, replay %v", e, want)
		}
	}
}

func slicesMax(s []mem.Bytes) mem.Bytes {
	m := s[0]
	for _, v := range s {
		m = max(m, v)
	}
	return m
}

// TestSolveInFlightIsExhaustive compares SolveInFlight with every
// combination of choices on thousands of small chains split into one to
// three segments with up to five microbatches in flight each, at budgets
// from below the least bound to above the largest.
func TestSolveInFlightIsExhaustive(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	for k := 0; k < 3000; k++ {
		c := withOptions(r, randomChain(r, 1+r.Intn(6)))
		var segs []Segment
		for from := 0; from < c.Len(); {
			to := from + 1 + r.Intn(c.Len()-from)
			s := Segment{From: from, To: to, InputBytes: c.ActBytes[from] + mem.Bytes(r.Intn(3)), InFlight: 1 + r.Intn(5),
				Loss: to == c.Len(), DropOutput: to < c.Len() && r.Intn(2) == 0}
			for i := from; i < to; i++ {
				cs := []int{0}
				for o := 1; o < c.NumOptions(i); o++ {
					cs = append(cs, o)
				}
				if r.Intn(4) > 0 {
					cs = append(cs, Checkpoint)
				}
				s.Choices = append(s.Choices, cs)
			}
			segs = append(segs, s)
			from = to
		}
		// Every combination: the least extra at each bound.
		type combo struct {
			bound mem.Bytes
			extra float64
		}
		var all []combo
		choices := make([][]int, len(segs))
		var walk func(k, j int)
		walk = func(k, j int) {
			if k == len(segs) {
				m := segmentMemories(c, segs, choices)
				var e float64
				for q, s := range segs {
					e += c.SegmentExtra(s, choices[q])
				}
				all = append(all, combo{InFlightBound(segs, m), e})
				return
			}
			if j == len(segs[k].Choices) {
				walk(k+1, 0)
				return
			}
			if j == 0 {
				choices[k] = make([]int, len(segs[k].Choices))
			}
			for _, ch := range segs[k].Choices[j] {
				choices[k][j] = ch
				walk(k, j+1)
			}
		}
		walk(0, 0)
		least, most := mem.Bytes(math.MaxInt64), mem.Bytes(0)
		for _, a := range all {
			least, most = min(least, a.bound), max(most, a.bound)
		}
		for budget := least - 2; budget <= most+1; budget++ {
			want := math.Inf(1)
			for _, a := range all {
				if a.bound <= budget {
					want = min(want, a.extra)
				}
			}
			got, err := SolveInFlight(c, segs, budget)
			var inf *ErrInfeasible
			if errors.As(err, &inf) {
				if !math.IsInf(want, 1) || inf.MinBudget != least {
					t.Fatalf("budget %d: infeasible (least %d), exhaustive search finds extra %v (least bound %d)", budget, inf.MinBudget, want, least)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			var e float64
			for q, s := range segs {
				e += c.SegmentExtra(s, got[q])
			}
			if b := InFlightBound(segs, segmentMemories(c, segs, got)); b > budget || e != want {
				t.Fatalf("budget %d: choices %v bound %d extra %v, exhaustive search %v", budget, got, b, e, want)
			}
		}
	}
}

// TestPruneMergedIsPruneTo: merging each choice's states, which come in
// their parents' front order, prunes to the front sorting them all gives,
// state for state: on random fronts, with costs that adding a choice's
// rounds together (1e16 + 1 and 1e16 + 2 both become 1e16 + 2), ties in
// every field, and limits that force coarser grains.
func TestPruneMergedIsPruneTo(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for trial := range 300 {
		parents := make([]point, 1+r.Intn(60))
		for i := range parents {
			parents[i] = point{a: mem.Bytes(r.Intn(40)), b: mem.Bytes(r.Intn(40)), cost: float64(r.Intn(30))}
			if trial%3 == 0 {
				parents[i].cost += 1e16
			}
		}
		parents = pruneTo(parents, 1<<30)
		type choice struct {
			kept, loc mem.Bytes
			extra     float64
		}
		choices := make([]choice, 1+r.Intn(6))
		for ci := range choices {
			choices[ci] = choice{mem.Bytes(r.Intn(20)), mem.Bytes(r.Intn(50)), float64(r.Intn(10))}
			if trial%3 == 0 {
				choices[ci].extra = 1 + float64(r.Intn(2)) // rounds odd costs near 1e16
			}
		}
		var flat []point
		lists := make([][]point, len(choices))
		for pi, st := range parents {
			for ci, ch := range choices {
				ns := point{a: st.a + ch.kept, b: max(st.b, st.a+ch.loc), cost: st.cost + ch.extra, parent: int32(pi), choice: int32(ci)}
				if ns.b > 70 {
					continue
				}
				flat = append(flat, ns)
				lists[ci] = append(lists[ci], ns)
			}
		}
		for _, limit := range []int{1 << 30, 8, 3} {
			want := pruneTo(slices.Clone(flat), limit)
			copied := make([][]point, len(lists))
			for i, l := range lists {
				copied[i] = slices.Clone(l)
			}
			if got := pruneMerged(copied, limit); !slices.Equal(got, want) {
				t.Fatalf("trial %d, limit %d:\nmerged %v\nsorted %v", trial, limit, got, want)
			}
		}
	}
}
