package solver

import (
	"fmt"
	"math"
	"strings"
)

// Strategies lists the strategies Solve knows, cheapest-to-compute first.
// "optimal" chooses among F_all, F_ck and F_n; "selective" also chooses,
// for every storing forward, among the stage's options (Chain.Options).
var Strategies = []string{"none", "every-k", "sqrt", "chen-greedy", "revolve", "optimal", "selective"}

// Options tunes Solve. The zero value (or nil) means defaults.
type Options struct {
	Slots int // optimal, selective: slots of the table (0: DefaultSlots)
	K     int // every-k: checkpoint every K-th stage (0: 1)
	// Candidates are more schedules selective compares its own with,
	// such as a named policy applied everywhere; it returns the cheapest
	// that fits.
	Candidates []Schedule
}

// Solution is a schedule and its replay.
type Solution struct {
	Strategy string
	Schedule Schedule
	Result
}

// Solve returns the schedule a strategy makes for a budget (bytes, a_0
// included), replayed by Simulate. A budget the strategy cannot meet is an
// *ErrInfeasible whose MinBudget is the least the strategy needs (for the
// optimal strategy: the least found by bisection on the table's budget).
func Solve(c *Chain, strategy string, budget int64, o *Options) (*Solution, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opt Options
	if o != nil {
		opt = *o
	}
	switch strategy {
	case "none":
		return Fixed(c, strategy, StoreAll(c), budget)
	case "every-k":
		return Fixed(c, strategy, EveryK(c, opt.K), budget)
	case "sqrt":
		return Fixed(c, strategy, Sqrt(c), budget)
	case "chen-greedy":
		s, _ := ChenGreedy(c, budget)
		return Fixed(c, strategy, s, budget)
	case "revolve":
		return solveRevolve(c, budget)
	case "optimal":
		plain := *c
		plain.Options = nil
		return solveOptimal(&plain, "optimal", budget, opt.Slots, nil)
	case "selective":
		return solveOptimal(c, "selective", budget, opt.Slots, opt.Candidates)
	}
	return nil, fmt.Errorf("unknown strategy %q (valid: %s)", strategy, strings.Join(Strategies, ", "))
}

// Fixed replays a schedule made elsewhere as strategy name: its solution,
// or an *ErrInfeasible with its peak when it does not fit the budget.
func Fixed(c *Chain, name string, s Schedule, budget int64) (*Solution, error) {
	r, err := Simulate(c, s)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if r.Peak > budget {
		return nil, &ErrInfeasible{Budget: budget, MinBudget: r.Peak}
	}
	return &Solution{Strategy: name, Schedule: s, Result: r}, nil
}

// solveRevolve tries every snapshot count and keeps the cheapest schedule
// that fits.
func solveRevolve(c *Chain, budget int64) (*Solution, error) {
	var best *Solution
	minPeak := int64(math.MaxInt64)
	split := revolveSplits(c.Len(), c.Len())
	for s := 1; s <= c.Len(); s++ {
		sched := revolveWith(c, min(s-1, c.Len()), split)
		r, err := Simulate(c, sched)
		if err != nil {
			return nil, fmt.Errorf("revolve: %v", err)
		}
		minPeak = min(minPeak, r.Peak)
		if r.Peak <= budget && (best == nil || r.Cost < best.Cost) {
			best = &Solution{Strategy: "revolve", Schedule: sched, Result: r}
		}
	}
	if best == nil {
		return nil, &ErrInfeasible{Budget: budget, MinBudget: minPeak}
	}
	return best, nil
}

// solveOptimal reads the table, then compares its schedule with the
// baselines' and the candidates'.
func solveOptimal(c *Chain, name string, budget int64, slots int, candidates []Schedule) (*Solution, error) {
	t, err := NewTable(c, budget, slots)
	if err != nil {
		return nil, err
	}
	var best *Solution
	if s, err := t.Schedule(budget); err == nil {
		r, err := Simulate(c, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err) // a bug: the table only builds valid schedules
		}
		best = &Solution{Strategy: name, Schedule: s, Result: r}
	}
	// Rounding sizes up to slots can cost the table a schedule a baseline
	// finds; the optimal strategy is never worse than any of them. At equal
	// cost it takes the baseline, the simpler schedule (storing everything
	// when that fits, rather than a keep set that reruns free copies).
	need := int64(math.MaxInt64)
	for _, base := range []string{"none", "every-k", "sqrt", "chen-greedy", "revolve"} {
		b, err := Solve(c, base, budget, nil)
		if inf, ok := err.(*ErrInfeasible); ok && inf.MinBudget > 0 {
			need = min(need, inf.MinBudget)
		}
		if err == nil && (best == nil || b.Cost <= best.Cost) {
			best = &Solution{Strategy: name, Schedule: b.Schedule, Result: b.Result}
		}
	}
	for k, s := range candidates {
		r, err := Simulate(c, s)
		if err != nil {
			return nil, fmt.Errorf("%s: candidate %d: %v", name, k, err)
		}
		if r.Peak > budget {
			need = min(need, r.Peak)
		} else if best == nil || r.Cost < best.Cost {
			best = &Solution{Strategy: name, Schedule: s, Result: r}
		}
	}
	if best == nil {
		if m := minOptimalBudget(c, budget, slots); m > 0 {
			need = min(need, m)
		}
		if need == math.MaxInt64 {
			need = 0
		}
		return nil, &ErrInfeasible{Budget: budget, MinBudget: need}
	}
	return best, nil
}

// minOptimalBudget finds, by bisection between the budget that failed and
// the peak of Revolve with one snapshot (the least memory of any schedule
// of the family, up to transients), the smallest budget at which the
// table finds a schedule; it returns that schedule's replayed peak.
func minOptimalBudget(c *Chain, failed int64, slots int) int64 {
	hi := int64(math.MaxInt64)
	for s := 1; s <= min(c.Len(), 2); s++ {
		if r, err := Simulate(c, Revolve(c, s)); err == nil {
			hi = min(hi, r.Peak)
		}
	}
	if r, err := Simulate(c, StoreAll(c)); err == nil {
		hi = min(hi, r.Peak)
	}
	lo := failed
	slots = max(slots, DefaultSlots)
	peakAt := func(b int64) (int64, bool) {
		t, err := NewTable(c, b, slots)
		if err != nil {
			return 0, false
		}
		s, err := t.Schedule(b)
		if err != nil {
			return 0, false
		}
		r, err := Simulate(c, s)
		return r.Peak, err == nil
	}
	best, ok := peakAt(hi)
	for i := 0; !ok && i < 64; i++ { // rounding can make hi too small: grow it
		hi += hi/2 + 1
		best, ok = peakAt(hi)
	}
	if !ok {
		return 0
	}
	for i := 0; i < 40 && hi-lo > 1; i++ {
		mid := lo + (hi-lo)/2
		if p, ok := peakAt(mid); ok {
			hi, best = mid, min(best, p)
		} else {
			lo = mid
		}
	}
	return best
}
