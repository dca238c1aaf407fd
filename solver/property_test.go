package solver

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
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
			b += c.ActBytes[delta] + gradsFrom(c, delta)
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
			if u.Activations+u.Tapes+u.Gradients+u.ParamGrads+u.Transient != sol.Timeline[j] || u.Transient < 0 || u.Activations < 0 || u.ParamGrads < 0 {
				t.Fatalf("chain %d op %d: usage %+v, peak %d", k, j, u, sol.Timeline[j])
			}
		}
	}
}

// spreadChain is a random chain whose sizes spread over 10⁰–10¹² bytes
// and whose costs over 10⁰–10⁶, so that rounding to slots matters.
func spreadChain(r *rand.Rand, l int) *Chain {
	size := func() mem.Bytes { return mem.Bytes(math.Pow(10, 12*r.Float64())) }
	cost := func() float64 { return math.Round(math.Pow(10, 6*r.Float64())) }
	c := &Chain{LossBackward: cost(), LossTempBytes: size() / 10}
	for i := 0; i <= l; i++ {
		c.ActBytes = append(c.ActBytes, max(size(), 1))
	}
	for i := 0; i < l; i++ {
		c.Forward = append(c.Forward, cost())
		c.Backward = append(c.Backward, cost())
		c.TapeBytes = append(c.TapeBytes, c.ActBytes[i+1]+size())
		c.ForwardTempBytes = append(c.ForwardTempBytes, size()/4)
		c.BackwardTempBytes = append(c.BackwardTempBytes, size()/4)
	}
	return c
}

// TestOptimalPromisesAfterRounding: on thousands of chains with widely
// spread sizes and a coarse grid (40 slots), Optimal's schedule fits its
// budget; its cost never rises with the budget; it is never above any
// baseline that fits (every k of EveryK, √N, Chen's greedy, Revolve with
// any snapshot count, storing everything); and a budget it refuses
// reports a larger minimum that, given back, it plans.
func TestOptimalPromisesAfterRounding(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	for k := 0; k < 2000; k++ {
		c := spreadChain(r, 1+r.Intn(7))
		if r.Intn(2) == 0 {
			c = withSpreadOptions(r, c)
		}
		top := storeAllPeak(t, c)
		var budgets []mem.Bytes
		for range 8 {
			budgets = append(budgets, c.ActBytes[0]+mem.Bytes(float64(top)*math.Pow(r.Float64(), 3)))
		}
		budgets = append(budgets, top)
		slices.Sort(budgets)
		prev := math.Inf(1)
		for _, b := range budgets {
			sol, err := Optimal(c, b, 40)
			var inf *ErrInfeasible
			cost := math.Inf(1)
			switch {
			case errors.As(err, &inf):
				if inf.MinBudget <= b {
					t.Fatalf("chain %d at %d: infeasible, but the minimum it reports is %d", k, b, inf.MinBudget)
				}
				if _, err := Optimal(c, inf.MinBudget, 40); err != nil {
					t.Fatalf("chain %d: the minimum %d it reported is refused: %v", k, inf.MinBudget, err)
				}
			case err != nil:
				t.Fatalf("chain %d at %d: %v", k, b, err)
			default:
				ref, peak, err := referenceReplay(c, sol.Schedule)
				if err != nil || ref != sol.Cost || peak > b {
					t.Fatalf("chain %d at %d: replays to %v, %d (%v); says %v", k, b, ref, peak, err, sol.Cost)
				}
				cost = sol.Cost
			}
			if cost > prev {
				t.Fatalf("chain %d: cost rises from %v to %v at budget %d", k, prev, cost, b)
			}
			prev = cost
			for name, s := range allBaselines(c) {
				if rc, peak, err := referenceReplay(c, s); err == nil && peak <= b && rc < cost {
					t.Fatalf("chain %d at %d: %s costs %v, optimal %v", k, b, name, rc, cost)
				}
			}
		}
	}
}

// allBaselines returns every baseline schedule, by name.
func allBaselines(c *Chain) map[string]Schedule {
	out := map[string]Schedule{"none": StoreAll(c), "sqrt": Sqrt(c)}
	for k := 1; k <= c.Len(); k++ {
		out[fmt.Sprintf("every-%d", k)] = EveryK(c, k)
	}
	for s := 1; s <= c.Len(); s++ {
		out[fmt.Sprintf("revolve-%d", s)] = Revolve(c, s)
	}
	return out
}

// withSpreadOptions gives every stage of c up to three options with
// spread sizes, each keeping a smaller tape for a dearer backward.
func withSpreadOptions(r *rand.Rand, c *Chain) *Chain {
	c.Options = make([][]Option, c.Len())
	for i := range c.Options {
		for k := r.Intn(4); k > 0; k-- {
			extra := c.TapeBytes[i] - c.ActBytes[i+1]
			c.Options[i] = append(c.Options[i], Option{
				TapeBytes:         c.ActBytes[i+1] + mem.Bytes(r.Float64()*float64(extra)),
				FAllTempBytes:     mem.Bytes(r.Float64() * float64(extra)),
				Backward:          c.Backward[i] + math.Round(math.Pow(10, 4*r.Float64())),
				BackwardTempBytes: c.BackwardTempBytes[i] + mem.Bytes(r.Float64()*float64(extra)),
			})
		}
	}
	return c
}

// TestSimulateUnsavedActs follows a_1, which no op saves, out of the tape
// ā_1 that holds it once F_all(1) has read it, before the loss; three
// stages of 10-byte activations and 30-byte tapes, a_0 1 byte, no
// transients. Storing everything: 31 after F_all(0); F_all(1) peaks at
// 61 and leaves 51; F_all(2) 81; the loss 91 with δ_3; B(2) 91, B(1) 61,
// B(0) 31 (ā_1 less a_1, and δ_1). Where a_1 is a checkpoint's input, or
// stage 1 keeps part of its tape, or reruns after the loss, a_1 stays.
func TestSimulateUnsavedActs(t *testing.T) {
	c := &Chain{
		Forward: []float64{1, 1, 1}, Backward: []float64{1, 1, 1},
		ActBytes: []mem.Bytes{1, 10, 10, 10}, TapeBytes: []mem.Bytes{30, 30, 30},
		ForwardTempBytes: make([]mem.Bytes, 3), BackwardTempBytes: make([]mem.Bytes, 3),
		UnsavedActs: []bool{false, true, false, false},
		Options:     [][]Option{nil, {{TapeBytes: 20, Backward: 2}}, nil},
	}
	all := StoreAll(c)
	r, err := Simulate(c, all)
	if err != nil {
		t.Fatal(err)
	}
	if want := []mem.Bytes{31, 61, 81, 91, 91, 61, 31}; !slices.Equal(r.Timeline, want) {
		t.Errorf("storing everything: timeline %v, want %v", r.Timeline, want)
	}
	held := func(name string, sched Schedule, want []mem.Bytes) {
		t.Helper()
		r, err := Simulate(c, sched)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.Timeline, want) {
			t.Errorf("%s: timeline %v, want %v", name, r.Timeline, want)
		}
	}
	// F_all(1) frees a_1 after its last reader, halfway: it peaks at 51.
	c.FAllInputFreedTempBytes = []mem.Bytes{0, -10, 0}
	if r, err := Simulate(c, all); err != nil || r.Timeline[1] != 51 {
		t.Errorf("freeing a_1 within F_all(1): timeline %v (%v), want 51 at F_all(1)", r.Timeline, err)
	}
	// Stage 1 keeps a 20-byte tape: a_1 stays in ā_1.
	held("stage 1 selective", Schedule{{Kind: FAll, Stage: 0}, {Kind: FAll, Stage: 1, Option: 1}, {Kind: FAll, Stage: 2},
		{Kind: Loss, Stage: 3}, {Kind: B, Stage: 2}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}},
		[]mem.Bytes{31, 51, 81, 91, 91, 61, 41})
	// Stage 1 checkpointed (a_2 standalone) and rerun storing after the
	// loss: a_1 stays to B(0).
	held("stage 1 rerun", Schedule{{Kind: FAll, Stage: 0}, {Kind: FCk, Stage: 1}, {Kind: FAll, Stage: 2},
		{Kind: Loss, Stage: 3}, {Kind: B, Stage: 2}, {Kind: FAll, Stage: 1}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}},
		[]mem.Bytes{31, 41, 71, 81, 81, 71, 71, 41})
}

// TestSimulateMakerUnsaved follows a_1, which no op of stage 0 saves, out
// of the tape ā_1 once B(1) has run (Chain.MakerUnsaved): two stages,
// a_0 1 byte, a_1 10, a_2 100, tapes 30 and 200, B(0) 400 bytes of
// transients. Storing everything: 31 after F_all(0), 231 after F_all(1),
// 331 at the loss (δ_2) and B(1); then δ_1 (10) and ā_1 less a_1 (20)
// are 31 before B(0), which peaks at 431, not the 441 of a_1 held. A
// checkpointed stage 0 rerun storing after B(1) frees a_1 once it has
// run: 41 at the rerun, 431 at B(0). Without the flag, a_1 stays.
//
// Stage 0's option 1 keeps a tape of 25 bytes, a_1 included: 26 after
// its F_all, 36 after B(1). Where its B(0) reruns the op that makes a_1
// (Option.RemakesOutput), the tape holds a_1 to B(0), which peaks at
// 436; where it does not, a_1 leaves as with option 0, and B(0) peaks
// at 426.
func TestSimulateMakerUnsaved(t *testing.T) {
	c := &Chain{
		Forward: []float64{1, 1}, Backward: []float64{1, 1},
		ActBytes: []mem.Bytes{1, 10, 100}, TapeBytes: []mem.Bytes{30, 200},
		ForwardTempBytes: make([]mem.Bytes, 2), BackwardTempBytes: []mem.Bytes{400, 0},
		MakerUnsaved: []bool{false, true, false},
		Options:      [][]Option{{{TapeBytes: 25, Backward: 2, BackwardTempBytes: 400}}, nil},
	}
	rerun := Schedule{{Kind: FCk, Stage: 0}, {Kind: FAll, Stage: 1}, {Kind: Loss, Stage: 2}, {Kind: B, Stage: 1}, {Kind: FAll, Stage: 0}, {Kind: B, Stage: 0}}
	option := Schedule{{Kind: FAll, Stage: 0, Option: 1}, {Kind: FAll, Stage: 1}, {Kind: Loss, Stage: 2}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}}
	rerunOption := Schedule{{Kind: FCk, Stage: 0}, {Kind: FAll, Stage: 1}, {Kind: Loss, Stage: 2}, {Kind: B, Stage: 1}, {Kind: FAll, Stage: 0, Option: 1}, {Kind: B, Stage: 0}}
	for _, tc := range []struct {
		name          string
		flag, remakes bool
		sched         Schedule
		want          []mem.Bytes
	}{
		{"store", true, false, StoreAll(c), []mem.Bytes{31, 231, 331, 331, 431}},
		{"store, held", false, false, StoreAll(c), []mem.Bytes{31, 231, 331, 331, 441}},
		{"store, an option remakes", true, true, StoreAll(c), []mem.Bytes{31, 231, 331, 331, 431}},
		{"rerun", true, false, rerun, []mem.Bytes{11, 211, 311, 311, 41, 431}},
		{"rerun, held", false, false, rerun, []mem.Bytes{11, 211, 311, 311, 41, 441}},
		{"option", true, false, option, []mem.Bytes{26, 226, 326, 326, 426}},
		{"option remakes", true, true, option, []mem.Bytes{26, 226, 326, 326, 436}},
		{"rerun option", true, false, rerunOption, []mem.Bytes{11, 211, 311, 311, 36, 426}},
		{"rerun option remakes", true, true, rerunOption, []mem.Bytes{11, 211, 311, 311, 36, 436}},
	} {
		c.MakerUnsaved[1] = tc.flag
		c.Options[0][0].RemakesOutput = tc.remakes
		r, err := Simulate(c, tc.sched)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(r.Timeline, tc.want) {
			t.Errorf("%s: timeline %v, want %v", tc.name, r.Timeline, tc.want)
		}
		if u := r.Usage[len(r.Usage)-1]; u.Activations+u.Tapes+u.Gradients+u.ParamGrads+u.Transient != r.Timeline[len(r.Timeline)-1] {
			t.Errorf("%s: B(0)'s usage %+v does not add up to %d", tc.name, u, r.Timeline[len(r.Timeline)-1])
		}
	}
}
