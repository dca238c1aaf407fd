package solver

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// strategies are the solver's ways of making a schedule, as the
// planner's strategies call them; k is every-k's k.
var strategies = []struct {
	name  string
	solve func(c *Chain, budget mem.Bytes, k, slots int) (*Solution, error)
}{
	{"none", func(c *Chain, b mem.Bytes, _, _ int) (*Solution, error) { return Fixed(c, StoreAll(c), b) }},
	{"every-k", func(c *Chain, b mem.Bytes, k, _ int) (*Solution, error) { return Fixed(c, EveryK(c, k), b) }},
	{"sqrt", func(c *Chain, b mem.Bytes, _, _ int) (*Solution, error) { return Fixed(c, Sqrt(c), b) }},
	{"chen-greedy", func(c *Chain, b mem.Bytes, _, _ int) (*Solution, error) {
		s, _ := ChenGreedy(c, b)
		return Fixed(c, s, b)
	}},
	{"revolve", func(c *Chain, b mem.Bytes, _, _ int) (*Solution, error) { return BestRevolve(c, b) }},
	{"optimal", func(c *Chain, b mem.Bytes, _, slots int) (*Solution, error) {
		plain := *c
		plain.Options = nil
		return Optimal(&plain, b, slots)
	}},
	{"selective", func(c *Chain, b mem.Bytes, _, slots int) (*Solution, error) { return Optimal(c, b, slots) }},
}

// TestStrategiesReplay: on random chains, every strategy's schedule replays
// within its budget at the reported cost and peak, by a replay written
// apart from Simulate, or the strategy says it cannot and names a minimum
// budget at which it can.
func TestStrategiesReplay(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for k := 0; k < 1000; k++ {
		c := randomChain(r, 1+r.Intn(12))
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + mem.Bytes(r.Int63n(int64(top)))
		for _, st := range strategies {
			name := st.name
			sol, err := st.solve(c, budget, 1+r.Intn(3), int(budget))
			var inf *ErrInfeasible
			if errors.As(err, &inf) {
				if inf.MinBudget <= budget {
					t.Fatalf("chain %d, %s: infeasible at %d but min budget %d", k, name, budget, inf.MinBudget)
				}
				again, err := st.solve(c, inf.MinBudget, 1, int(inf.MinBudget))
				if name != "every-k" && (err != nil || again.Peak > inf.MinBudget) {
					t.Fatalf("chain %d, %s: min budget %d does not work: %v", k, name, inf.MinBudget, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("chain %d, %s: %v", k, name, err)
			}
			cost, peak, err := referenceReplay(c, sol.Schedule)
			if err != nil || cost != sol.Cost || peak != sol.Peak || peak > budget {
				t.Fatalf("chain %d, %s: reference replay cost %v peak %d, %v; solution cost %v peak %d budget %d", k, name, cost, peak, err, sol.Cost, sol.Peak, budget)
			}
		}
	}
}

// referenceReplay replays a schedule under the memory model of the
// package doc, written from the rules and apart from Simulate: the live
// bytes are recounted from the live sets at every op.
func referenceReplay(c *Chain, sched Schedule) (float64, mem.Bytes, error) {
	l := c.Len()
	act := map[int]bool{0: true} // standalone a_i
	ckpt := map[int]bool{}       // a_i kept by F_ck(i)
	tape := map[int]int{}        // ā_{i+1} by stage i → its option
	delta := -1                  // the live gradient δ_delta
	live := func() mem.Bytes {
		var b mem.Bytes
		for i := range act {
			b += c.ActBytes[i]
		}
		for i, o := range tape {
			b += c.Option(i, o).TapeBytes
		}
		if delta >= 0 {
			b += c.ActBytes[delta]
		}
		return b
	}
	has := func(i int) bool {
		_, t := tape[i-1]
		return act[i] || t
	}
	var cost float64
	peak := live()
	for k, op := range sched {
		i := op.Stage
		var during mem.Bytes
		switch op.Kind {
		case FCk, FN, FAll:
			if i < 0 || i >= l || !has(i) || has(i+1) {
				return 0, 0, fmt.Errorf("op %d: %v is not runnable", k, op)
			}
			cost += c.Forward[i]
			if op.Kind == FAll {
				o := c.Option(i, op.Option)
				during = live() + o.TapeBytes + o.FAllTempBytes
				tape[i] = op.Option
				break
			}
			during = live() + c.ActBytes[i+1] + c.ForwardTempBytes[i]
			act[i+1] = true
			if op.Kind == FCk && act[i] {
				ckpt[i] = true
			}
			if op.Kind == FN && !ckpt[i] {
				delete(act, i)
			}
		case Loss:
			if delta >= 0 || !has(l) {
				return 0, 0, fmt.Errorf("op %d: loss is not runnable", k)
			}
			cost += c.LossBackward
			during = live() + c.LossTempBytes
			delete(act, l)
			delta = l
		case B:
			o, ok := tape[i]
			if delta != i+1 || !ok || !has(i) {
				return 0, 0, fmt.Errorf("op %d: %v is not runnable", k, op)
			}
			opt := c.Option(i, o)
			cost += opt.Backward
			during = live() + opt.BackwardTempBytes
			delete(tape, i)
			delete(act, i)
			delete(ckpt, i)
			delta = i
		}
		peak = max(peak, during, live())
	}
	if delta != 0 {
		return 0, 0, errors.New("the backward is incomplete")
	}
	return cost, peak, nil
}

// TestOptimalDominates: the optimal cost never rises as the budget grows,
// and never exceeds any baseline's cost at the same budget.
func TestOptimalDominates(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for k := 0; k < 300; k++ {
		c := randomChain(r, 1+r.Intn(15))
		top := storeAllPeak(t, c)
		tab, err := NewTable(c, top, int(top))
		if err != nil {
			t.Fatal(err)
		}
		prev := math.Inf(1)
		for budget := c.ActBytes[0]; budget <= top; budget++ {
			cost := tab.Cost(budget)
			if cost > prev {
				t.Fatalf("chain %d: cost rises from %v to %v at budget %d", k, prev, cost, budget)
			}
			prev = cost
			for _, st := range strategies[:len(strategies)-2] {
				if b, err := st.solve(c, budget, 2, 0); err == nil && b.Cost < cost {
					t.Fatalf("chain %d, budget %d: %s costs %v, optimal %v", k, budget, st.name, b.Cost, cost)
				}
			}
		}
		if got, want := tab.Cost(top), storeAllCost(c); got != want {
			t.Fatalf("chain %d: optimal at the store-all peak costs %v, storing all %v", k, got, want)
		}
	}
}

func storeAllCost(c *Chain) float64 {
	var s float64
	for i := range c.Forward {
		s += c.Forward[i] + c.Backward[i]
	}
	return s + c.LossBackward
}

// TestRounding: with fewer slots than bytes the table is conservative: its
// schedules still fit, and cost no less than with exact sizes.
func TestRounding(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	for k := 0; k < 300; k++ {
		c := randomChain(r, 1+r.Intn(10))
		for i := range c.ActBytes {
			c.ActBytes[i] *= 1000
		}
		for i := range c.TapeBytes {
			c.TapeBytes[i] *= 1000
			c.ForwardTempBytes[i] *= 1000
			c.BackwardTempBytes[i] *= 1000
		}
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + mem.Bytes(r.Int63n(int64(top)))
		coarse, _ := NewTable(c, budget, 37)
		fine, _ := NewTable(c, budget, int(budget))
		if coarse.Cost(budget) < fine.Cost(budget) {
			t.Fatalf("chain %d: rounded table cheaper than exact", k)
		}
		if s, err := coarse.Schedule(budget); err == nil {
			res, err := Simulate(c, s)
			if err != nil || res.Peak > budget || res.Cost != coarse.Cost(budget) {
				t.Fatalf("chain %d: rounded schedule replays %+v, %v within %d", k, res, err, budget)
			}
		}
	}
}

func TestSimulateRejects(t *testing.T) {
	c := homogeneous(3, 2, 4)
	tests := []struct {
		name  string
		sched Schedule
		want  string
	}{
		{"input not live", Schedule{{Kind: FAll, Stage: 1}}, "a_1 is not live"},
		{"no tape", Schedule{{Kind: FCk, Stage: 0}, {Kind: FCk, Stage: 1}, {Kind: FCk, Stage: 2}, {Kind: Loss, Stage: 3}, {Kind: B, Stage: 2}}, "tape ā_3 is not live"},
		{"incomplete", Schedule{{Kind: FAll, Stage: 0}, {Kind: FAll, Stage: 1}, {Kind: FAll, Stage: 2}, {Kind: Loss, Stage: 3}}, "incomplete"},
		{"twice", Schedule{{Kind: FAll, Stage: 0}, {Kind: FCk, Stage: 0}}, "already live"},
		{"drops a checkpoint", Schedule{{Kind: FCk, Stage: 0}, {Kind: FN, Stage: 1}, {Kind: FAll, Stage: 2}, {Kind: Loss, Stage: 3}, {Kind: B, Stage: 2}, {Kind: FN, Stage: 0}}, "a_0 is a checkpoint"},
		{"no such stage", Schedule{{Kind: B, Stage: 7}}, "no stage 7"},
		{"option of a B", Schedule{{Kind: FAll, Stage: 0}, {Kind: B, Stage: 0, Option: 1}}, "no option 1"},
		{"no such option", Schedule{{Kind: FAll, Stage: 0, Option: 1}}, "no option 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Simulate(c, tt.sched)
			if err == nil || !contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want %q", err, tt.want)
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestUsageAddsUp: the usage of every op adds up to its peak, with no
// negative part.
func TestUsageAddsUp(t *testing.T) {
	r := rand.New(rand.NewSource(9))
	for k := 0; k < 200; k++ {
		c := randomChain(r, 1+r.Intn(8))
		sol, err := BestRevolve(c, 1<<40)
		if err != nil {
			t.Fatal(err)
		}
		for j, u := range sol.Usage {
			if u.Activations+u.Tapes+u.Gradients+u.Transient != sol.Timeline[j] || u.Transient < 0 || u.Activations < 0 {
				t.Fatalf("chain %d op %d: usage %+v, peak %d", k, j, u, sol.Timeline[j])
			}
		}
	}
}
