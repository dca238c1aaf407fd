package solver

import (
	"errors"
	"math"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// perLayerExhaustive returns the least cost of any per-layer schedule of
// c (each stage stored under one of its options, not Named, or
// checkpointed and rerun whole; pinned stages stored whole) that replays
// within budget, trying every one: O((V+1)^L) replays.
func perLayerExhaustive(t *testing.T, c *Chain, budget mem.Bytes, pinned []bool) float64 {
	l := c.Len()
	checkpointed, options := make([]bool, l), make([]int, l)
	best := math.Inf(1)
	var try func(i int)
	try = func(i int) {
		if i == l {
			r, err := Simulate(c, PerStage(checkpointed, options))
			if err != nil {
				t.Fatalf("per-stage schedule does not replay: %v", err)
			}
			if r.Peak <= budget {
				best = min(best, r.Cost)
			}
			return
		}
		n := c.NumOptions(i)
		if pinned != nil && pinned[i] {
			n = 1
		}
		for k := range n {
			if k > 0 && c.Option(i, k).Named {
				continue
			}
			checkpointed[i], options[i] = false, k
			try(i + 1)
		}
		if pinned == nil || !pinned[i] {
			checkpointed[i], options[i] = true, 0
			try(i + 1)
		}
	}
	try(0)
	return best
}

// TestPerLayerIsExhaustive: with a slot a byte, the per-layer table's cost
// at every budget is the least of every per-layer schedule's that fits
// (options and pinned stages included), its schedule replays at that cost
// within the budget, and it is never below the full recurrence's, which
// may also rerun a run of stages from one checkpoint.
func TestPerLayerIsExhaustive(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	n := 1500
	if testing.Short() {
		n = 200
	}
	for k := range n {
		l := 1 + r.Intn(6)
		c := randomChain(r, l)
		if r.Intn(2) == 0 {
			withOptions(r, c)
		}
		if r.Intn(3) == 0 { // a forward's transients past its tape's (attention's scores)
			for i := range c.ForwardTempBytes {
				c.ForwardTempBytes[i] += mem.Bytes(r.Intn(16))
			}
		}
		var pinned []bool
		if r.Intn(2) == 0 {
			pinned = make([]bool, l)
			pinned[0], pinned[l-1] = true, true
		}
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + mem.Bytes(r.Int63n(int64(top)))
		lt, err := NewLayerTable(c, top, int(top), pinned)
		if err != nil {
			t.Fatal(err)
		}
		want := perLayerExhaustive(t, c, budget, pinned)
		got := lt.Cost(budget)
		if got != want {
			t.Fatalf("chain %d (%+v, pinned %v), budget %d: per-layer table %v, exhaustive %v", k, *c, pinned, budget, got, want)
		}
		full, err := NewTable(c, top, int(top))
		if err != nil {
			t.Fatal(err)
		}
		if f := full.Cost(budget); got < f {
			t.Fatalf("chain %d, budget %d: per-layer %v below the full recurrence's %v", k, budget, got, f)
		}
		if math.IsInf(got, 1) {
			if _, err := lt.Schedule(budget); err == nil {
				t.Fatalf("chain %d, budget %d: a schedule where none fits", k, budget)
			}
			continue
		}
		s, err := lt.Schedule(budget)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Simulate(c, s)
		if err != nil || res.Cost != got || res.Peak > budget {
			t.Fatalf("chain %d: schedule %v replays at cost %v peak %d (%v); the table says %v within %d", k, s, res.Cost, res.Peak, err, got, budget)
		}
	}
}

// TestPerLayerNeverAboveBudget: on the default grid, where sizes round to
// slots, PerLayer's schedule is per-layer and fits; when none fits, the
// least budget it gives back is planned.
func TestPerLayerNeverAboveBudget(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	for k := range 300 {
		l := 2 + r.Intn(30)
		c := withOptions(r, benchChain(r, l, 1000))
		pinned := make([]bool, l)
		pinned[0], pinned[l-1] = true, true
		top := storeAllPeak(t, c)
		budget := mem.Bytes(r.Int63n(int64(top) + 1))
		sol, err := PerLayer(c, budget, 50, pinned)
		var inf *ErrInfeasible
		switch {
		case err == nil:
			if sol.Peak > budget {
				t.Fatalf("chain %d: peak %d above the budget %d", k, sol.Peak, budget)
			}
			checkPerLayer(t, sol.Schedule, pinned)
		case errors.As(err, &inf) && inf.MinBudget > budget && inf.MinBudget != math.MaxInt64:
			again, err := PerLayer(c, inf.MinBudget, 50, pinned)
			if err != nil || again.Peak > inf.MinBudget {
				t.Fatalf("chain %d: the least budget %d given back does not plan: %v", k, inf.MinBudget, err)
			}
		default:
			t.Fatalf("chain %d, budget %d: %v", k, budget, err)
		}
	}
}

// checkPerLayer fails unless s forwards every stage once before the loss
// (a pinned one keeping its tape), reruns only checkpointed stages, each
// once and right before its backward, and never runs F_n.
func checkPerLayer(t *testing.T, s Schedule, pinned []bool) {
	t.Helper()
	forwards := map[int]int{}
	ckpt := map[int]bool{}
	lossAt := -1
	for k, op := range s {
		switch op.Kind {
		case FN:
			t.Fatalf("%v: F_n(%d) reruns from an earlier checkpoint", s, op.Stage)
		case FCk:
			ckpt[op.Stage] = true
			if pinned[op.Stage] {
				t.Fatalf("%v: pinned stage %d checkpointed", s, op.Stage)
			}
		case Loss:
			lossAt = k
		case FAll:
			if lossAt >= 0 && (!ckpt[op.Stage] || k+1 >= len(s) || s[k+1] != (Op{Kind: B, Stage: op.Stage})) {
				t.Fatalf("%v: F_all(%d) after the loss is no checkpoint's rerun before its backward", s, op.Stage)
			}
		}
		if op.Kind == FCk || op.Kind == FAll || op.Kind == FN {
			forwards[op.Stage]++
		}
	}
	for i, n := range forwards {
		if n > 2 || n == 2 && !ckpt[i] {
			t.Fatalf("%v: stage %d forwarded %d times", s, i, n)
		}
	}
}
