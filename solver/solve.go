package solver

import (
	"fmt"
	"iter"
	"math"
	"slices"

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
	return withTimeline(c, best)
}

// revolveBest returns the cheapest Revolve schedule that fits the budget
// (nil if none does) and the one with the least peak.
func revolveBest(c *Chain, budget mem.Bytes) (best, smallest *Solution) {
	split := revolveSplits(c.Len(), c.Len())
	for s := 1; s <= c.Len(); s++ {
		sched := revolveWith(c, min(s-1, c.Len()), split)
		r, err := replay(c, sched, false)
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
// included. Sizes are rounded up to slots of one grid for the chain,
// whatever the budget: the peak P of storing everything divided into
// slots slots (0: DefaultSlots). Rounding can cost the table a schedule
// that fits, so Optimal also replays the baselines (Baselines: storing
// everything, every-k for every k, √N, Chen's and Revolve's schedules) and
// the alternatives given, and returns
// the cheapest of all that fit. At equal cost it prefers a baseline, the
// simpler schedule (storing everything when that fits, rather than a keep
// set that reruns free copies), and the table's schedule to an
// alternative.
//
// Because the grid does not depend on the budget, the promises hold after
// rounding: the cost never rises with the budget, is never above a
// baseline's or an alternative's that fits, and a budget nothing fits is
// an *ErrInfeasible whose MinBudget, given back, is planned. O(slots·L·
// (L²+V)) for the table plus O(L²) replays for the baselines.
func Optimal(c *Chain, budget mem.Bytes, slots int, alternatives ...Schedule) (*Solution, error) {
	all, err := Simulate(c, StoreAll(c))
	if err != nil {
		return nil, err
	}
	// The baselines first, so that what their schedules take is freed
	// before the table is filled.
	var best *Solution
	need := mem.Bytes(math.MaxInt64)
	for b := range baselines(c) {
		r, err := replay(c, b, false)
		if err != nil {
			return nil, fmt.Errorf("optimal: baseline: %w", err)
		}
		if r.Peak > budget {
			need = min(need, r.Peak)
		} else if best == nil || r.Cost <= best.Cost {
			best = &Solution{Schedule: b, Result: r}
		}
	}
	if budget < all.Peak { // else storing everything fits, and costs least
		// The table's columns up to the budget: the schedule there needs
		// no other.
		t, err := newTable(c, all.Peak, slots, budget)
		if err != nil {
			return nil, err
		}
		if s, err := t.Schedule(budget); err == nil {
			r, err := Simulate(c, s)
			if err != nil {
				return nil, fmt.Errorf("optimal: %w", err) // a bug: the table only builds valid schedules
			}
			if best == nil || r.Cost < best.Cost { // a baseline at equal cost is simpler
				best = &Solution{Schedule: s, Result: r}
			}
		}
		least := t.MinBudget()
		if least == math.MaxInt64 {
			// Nothing fits up to the budget: the whole table says from where.
			if t, err = NewTable(c, all.Peak, slots); err != nil {
				return nil, err
			}
			least = t.MinBudget()
		}
		need = min(need, least)
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
		return nil, &ErrInfeasible{Budget: budget, MinBudget: need}
	}
	return withTimeline(c, best)
}

// withTimeline replays a solution found by a replay without timeline
// again, with it.
func withTimeline(c *Chain, s *Solution) (*Solution, error) {
	if s == nil || s.Timeline != nil {
		return s, nil
	}
	r, err := Simulate(c, s.Schedule)
	if err != nil {
		return nil, err
	}
	return &Solution{Schedule: s.Schedule, Result: r}, nil
}

// Baselines returns every schedule Optimal compares the table's with,
// whatever the budget: storing everything, √N, every-k for every k, every
// segmentation of Chen's greedy heuristic, and Revolve with every snapshot
// count. O(L³) to enumerate Chen's thresholds; O(L²) schedules at most.
func Baselines(c *Chain) []Schedule { return slices.Collect(baselines(c)) }

// baselines yields Baselines' schedules one at a time, each made when it
// is asked for.
func baselines(c *Chain) iter.Seq[Schedule] {
	return func(yield func(Schedule) bool) {
		if !yield(StoreAll(c)) || !yield(Sqrt(c)) {
			return
		}
		for k := 1; k <= c.Len(); k++ {
			if !yield(EveryK(c, k)) {
				return
			}
		}
		for s := range chenSchedules(c) {
			if !yield(s) {
				return
			}
		}
		split := revolveSplits(c.Len(), c.Len())
		for s := 1; s <= c.Len(); s++ {
			if !yield(revolveWith(c, min(s-1, c.Len()), split)) {
				return
			}
		}
	}
}
