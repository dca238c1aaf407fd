package solver

import (
	"cmp"
	"errors"
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/mem"
)

// Solution is a schedule and its replay.
type Solution struct {
	Schedule Schedule
	Result
}

// Fixed replays a schedule made elsewhere under a budget (bytes, a_0
// included): its solution, or an *ErrInfeasible with its peak when it
// does not fit.
func Fixed(c *Chain, s Schedule, budget mem.Bytes) (*Solution, error) {
	r, err := Simulate(c, s)
	if err != nil {
		return nil, err
	}
	if r.Peak > budget {
		return nil, &ErrInfeasible{Budget: budget, MinBudget: r.Peak}
	}
	return &Solution{Schedule: s, Result: r}, nil
}

// BestRevolve tries Revolve with every snapshot count and returns the
// cheapest schedule that fits the budget, or an *ErrInfeasible with the
// least peak of them. O(L) replays.
func BestRevolve(c *Chain, budget mem.Bytes) (*Solution, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	best, smallest := revolveBest(c, budget)
	if best == nil {
		return nil, &ErrInfeasible{Budget: budget, MinBudget: smallest.Peak}
	}
	return best, nil
}

// revolveBest returns the cheapest Revolve schedule that fits the budget
// (nil if none does) and the one with the least peak.
func revolveBest(c *Chain, budget mem.Bytes) (best, smallest *Solution) {
	split := revolveSplits(c.Len(), c.Len())
	for s := 1; s <= c.Len(); s++ {
		sched := revolveWith(c, min(s-1, c.Len()), split)
		r, err := Simulate(c, sched)
		if err != nil {
			panic(fmt.Sprintf("revolve built an invalid schedule: %v", err))
		}
		sol := &Solution{Schedule: sched, Result: r}
		if smallest == nil || r.Peak < smallest.Peak {
			smallest = sol
		}
		if r.Peak <= budget && (best == nil || r.Cost < best.Cost) {
			best = sol
		}
	}
	return best, smallest
}

// Optimal is what ckptplan means by the optimal schedule of a chain
// under a budget (bytes, a_0 included): the cheapest schedule the
// dynamic program (NewTable) finds on the chain, its stages' options
// included, with sizes rounded up to slots (0: DefaultSlots). Rounding
// can cost the table a schedule that fits, so Optimal also replays the
// baselines (StoreAll, EveryK(1), Sqrt, ChenGreedy, BestRevolve) and the
// alternatives given, and returns the cheapest of all that fit; it is
// therefore never dearer than any of them. At equal cost it prefers a
// baseline, the simpler schedule (storing everything when that fits,
// rather than a keep set that reruns free copies), and the table's
// schedule to an alternative.
//
// A budget nothing fits is an *ErrInfeasible whose MinBudget is the least
// peak found: of the baselines, the alternatives, and the table's
// schedule at the least budget it admits. O(slots·L·(L²+V)) for the table
// plus O(L²) replays for the baselines.
func Optimal(c *Chain, budget mem.Bytes, slots int, alternatives ...Schedule) (*Solution, error) {
	t, err := NewTable(c, budget, slots)
	var inf *ErrInfeasible
	if err != nil && !errors.As(err, &inf) {
		return nil, err
	}
	var best *Solution
	if t != nil {
		if s, err := t.Schedule(budget); err == nil {
			r, err := Simulate(c, s)
			if err != nil {
				return nil, fmt.Errorf("optimal: %w", err) // a bug: the table only builds valid schedules
			}
			best = &Solution{Schedule: s, Result: r}
		}
	}
	need := mem.Bytes(math.MaxInt64)
	for _, b := range baselines(c, budget) {
		r, err := Simulate(c, b)
		if err != nil {
			return nil, fmt.Errorf("optimal: baseline: %w", err)
		}
		if r.Peak > budget {
			need = min(need, r.Peak)
		} else if best == nil || r.Cost <= best.Cost {
			best = &Solution{Schedule: b, Result: r}
		}
	}
	for k, s := range alternatives {
		r, err := Simulate(c, s)
		if err != nil {
			return nil, fmt.Errorf("optimal: alternative %d: %w", k, err)
		}
		if r.Peak > budget {
			need = min(need, r.Peak)
		} else if best == nil || r.Cost < best.Cost {
			best = &Solution{Schedule: s, Result: r}
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

// baselines returns the schedules Optimal compares the table's with: for
// ChenGreedy and Revolve, the cheapest that fits the budget, else the one
// with the least peak.
func baselines(c *Chain, budget mem.Bytes) []Schedule {
	out := []Schedule{StoreAll(c), EveryK(c, 1), Sqrt(c)}
	chen, _ := ChenGreedy(c, budget)
	out = append(out, chen)
	best, smallest := revolveBest(c, budget)
	return append(out, cmp.Or(best, smallest).Schedule)
}

// minOptimalBudget returns the least peak of a schedule the table finds
// at any budget: one table, built for the least budget known to admit a
// schedule (the smallest peak of storing everything and of Revolve with
// one or two snapshots, grown where rounding rules it out), answers every
// smaller budget, so a bisection over its columns (O(1) each) finds the
// smallest that admits a schedule, which is then replayed. 0 when the
// table finds none.
func minOptimalBudget(c *Chain, failed mem.Bytes, slots int) mem.Bytes {
	hi := mem.Bytes(math.MaxInt64)
	for s := 1; s <= min(c.Len(), 2); s++ {
		if r, err := Simulate(c, Revolve(c, s)); err == nil {
			hi = min(hi, r.Peak)
		}
	}
	if r, err := Simulate(c, StoreAll(c)); err == nil {
		hi = min(hi, r.Peak)
	}
	slots = max(slots, DefaultSlots)
	var t *Table
	for i := 0; ; i++ {
		var err error
		if t, err = NewTable(c, hi, slots); err == nil && !math.IsInf(t.Cost(hi), 1) {
			break
		}
		if i == 64 || hi > math.MaxInt64/2 {
			return 0
		}
		hi += hi/2 + 1 // rounding can make hi too small: grow it
	}
	lo := min(failed, hi-1) // no schedule at lo
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if math.IsInf(t.Cost(mid), 1) {
			lo = mid
		} else {
			hi = mid
		}
	}
	s, err := t.Schedule(hi)
	if err != nil {
		return 0
	}
	r, err := Simulate(c, s)
	if err != nil {
		return 0
	}
	return r.Peak
}
