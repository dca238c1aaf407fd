package planner

// Keep sets on the hull.
//
// A pipeline device holds what each of its layers keeps once for every
// microbatch in flight, so its plan is a knapsack over its layers: each
// chooses a keep set, of kept bytes x and extra work c, and the sum of
// the x under the budget buys the least sum of the c. Over many layers
// the choices that matter are the lower convex hull of each layer's
// (x, c) points: a choice above the hull is beaten by mixing its two hull
// neighbours over layers, which keep as much on average for less work
// (the Lagrangian relaxation of the knapsack picks only hull points, and
// rounds to neighbours on it).
//
// In time every keep set has its own price, so the in-flight solver's
// fronts grow with the choices past solver.MaxFront and are rounded: a
// decoder layer of Llama-3-70B has 82 keep sets and 8 on its hull, and
// over 70B and 175B pipelines the whole family plans 8 to 65 times
// slower than the hull, within 0.2 points of extra time either way
// (docs/performance.md). So in time a chunk
// whose choices make more plans than solver.MaxFront is offered, per
// stage, its hull, storing and checkpointing; a shorter one, whose fronts
// the solver keeps exactly, every choice. In FLOPs most keep sets tie on
// a few reruns, the fronts stay narrow, and every choice is offered.
//
// What the hull leaves out is a choice whose transients, not what it
// keeps, decide whether a device fits, and mixes of layers the budget
// cannot split evenly: a plan a little dearer than the whole family's
// exact optimum can be, never over budget.

import (
	"cmp"
	"slices"

	"github.com/ckptplan/ckptplan/solver"
)

// hullChoices returns, of choices cs of chain stage i (options and
// solver.Checkpoint), those on the lower convex hull of their kept bytes
// and extra work, and storing (option 0) and checkpointing where cs has
// them, in cs's order.
func hullChoices(c *solver.Chain, i int, cs []int) []int {
	type point struct {
		choice      int
		kept, extra float64
	}
	pts := make([]point, 0, len(cs))
	for _, ch := range cs {
		if ch == solver.Checkpoint {
			pts = append(pts, point{ch, float64(c.ActBytes[i+1]), c.Forward[i]})
			continue
		}
		o := c.Option(i, ch)
		pts = append(pts, point{ch, float64(o.TapeBytes), o.Backward - c.Backward[i]})
	}
	slices.SortStableFunc(pts, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.kept, b.kept), cmp.Compare(a.extra, b.extra))
	})
	var hull []point // kept increasing, extra decreasing, convex
	for _, q := range pts {
		if len(hull) > 0 && q.extra >= hull[len(hull)-1].extra {
			continue // keeps no less for no less work
		}
		for len(hull) >= 2 {
			a, b := hull[len(hull)-2], hull[len(hull)-1]
			// b on or above the line from a to q
			if (b.kept-a.kept)*(q.extra-a.extra) > (b.extra-a.extra)*(q.kept-a.kept) {
				break
			}
			hull = hull[:len(hull)-1]
		}
		hull = append(hull, q)
	}
	on := map[int]bool{0: true, solver.Checkpoint: true}
	for _, q := range hull {
		on[q.choice] = true
	}
	return slices.DeleteFunc(slices.Clone(cs), func(ch int) bool { return !on[ch] })
}

// onHull returns segment s's choices, each stage's on its hull
// (hullChoices) where all of them make more than solver.MaxFront plans.
func onHull(c *solver.Chain, s solver.Segment) [][]int {
	ways := 1
	for _, cs := range s.Choices {
		if ways *= len(cs); ways > solver.MaxFront {
			break
		}
	}
	if ways <= solver.MaxFront {
		return s.Choices
	}
	out := make([][]int, len(s.Choices))
	for j, cs := range s.Choices {
		out[j] = hullChoices(c, s.From+j, cs)
	}
	return out
}
