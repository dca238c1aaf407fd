package solver

import (
	"errors"
	"math/rand"
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// TestSimulateCallArgs follows the model's call arguments (1000 bytes,
// taken by stages 1 and 2 of three) through three schedules worked by
// hand: storing everything frees them after stage 2's forward; a
// checkpointed stage 1, whose call holds them, frees them after B(1); a
// selective stage 2 (a smaller tape), after B(2).
func TestSimulateCallArgs(t *testing.T) {
	c := &Chain{
		Forward: []float64{1, 1, 1}, Backward: []float64{1, 1, 1},
		ActBytes: []mem.Bytes{1, 10, 10, 10}, TapeBytes: []mem.Bytes{20, 20, 20},
		ForwardTempBytes: make([]mem.Bytes, 3), BackwardTempBytes: make([]mem.Bytes, 3),
		Options:  [][]Option{nil, nil, {{TapeBytes: 15, Backward: 1}}},
		ArgBytes: 1000, TakesArgs: []bool{false, true, true},
	}
	for _, tc := range []struct {
		name  string
		sched Schedule
		want  []mem.Bytes
		args  []bool // live at each op's peak
	}{
		{"store", StoreAll(c), []mem.Bytes{21, 1041, 1061, 71, 71, 51, 31},
			[]bool{false, true, true, false, false, false, false}},
		{"checkpoint", Schedule{{Kind: FAll, Stage: 0}, {Kind: FCk, Stage: 1}, {Kind: FAll, Stage: 2}, {Kind: Loss, Stage: 3},
			{Kind: B, Stage: 2}, {Kind: FAll, Stage: 1}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}},
			[]mem.Bytes{21, 1031, 1051, 1061, 1061, 1051, 1051, 31},
			[]bool{false, true, true, true, true, true, true, false}},
		{"selective", Schedule{{Kind: FAll, Stage: 0}, {Kind: FAll, Stage: 1}, {Kind: FAll, Stage: 2, Option: 1}, {Kind: Loss, Stage: 3},
			{Kind: B, Stage: 2}, {Kind: B, Stage: 1}, {Kind: B, Stage: 0}},
			[]mem.Bytes{21, 1041, 1056, 1066, 1066, 51, 31},
			[]bool{false, true, true, true, true, false, false}},
	} {
		r, err := Simulate(c, tc.sched)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(r.Timeline, tc.want) {
			t.Errorf("%s: timeline %v, want %v", tc.name, r.Timeline, tc.want)
		}
		for k, u := range r.Usage {
			if want := map[bool]mem.Bytes{true: 1000}[tc.args[k]]; u.Arguments != want {
				t.Errorf("%s, op %d (%v): arguments %d in use, want %d", tc.name, k, tc.sched[k], u.Arguments, want)
			}
			if sum := u.Activations + u.Tapes + u.Gradients + u.ParamGrads + u.Arguments + u.Transient; sum != r.Timeline[k] {
				t.Errorf("%s, op %d: usage %+v adds up to %d, not %d", tc.name, k, u, sum, r.Timeline[k])
			}
		}
	}
}

// argsLive says, from the rule of Chain.ArgBytes and apart from
// Simulate, at which ops of a schedule the call arguments are live, and
// the op after which they are freed (-1: never made).
func argsLive(c *Chain, sched Schedule) (live []bool, end int) {
	live = make([]bool, len(sched))
	first := map[int]Op{} // each stage's first forward
	firstAt := map[int]int{}
	for k, op := range sched {
		if op.Kind == Loss {
			break
		}
		if _, ok := first[op.Stage]; !ok && op.Kind != B {
			first[op.Stage], firstAt[op.Stage] = op, k
		}
	}
	start, last, holder := -1, -1, -1
	for i := c.Len() - 1; i >= 0; i-- {
		if !c.TakesArgsAt(i) {
			continue
		}
		start = firstAt[i]
		if last < 0 {
			last = i
		}
		if op := first[i]; op.Kind != FAll || op.Option != 0 {
			holder = i // the lowest
		}
	}
	if start < 0 {
		return live, -1
	}
	end = firstAt[last]
	if holder >= 0 {
		end = slices.Index(sched, Op{Kind: B, Stage: holder})
	}
	for k := start; k <= end; k++ {
		live[k] = true
	}
	return live, end
}

// TestCallArgsOnRandomChains: on random chains whose middle stages take
// call arguments, every strategy's schedule fits its budget with them
// (the searches count them held the whole step) or names a least budget
// that works, and the replay adds them to the timeline exactly where
// argsLive says: at the op that frees them, by at most their bytes.
func TestCallArgsOnRandomChains(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for k := 0; k < 400; k++ {
		c := randomChain(r, 1+r.Intn(8))
		if r.Intn(2) == 0 {
			withOptions(r, c)
		}
		plain := *c
		c.ArgBytes = mem.Bytes(1 + r.Intn(6))
		c.TakesArgs = make([]bool, c.Len())
		for i := range c.TakesArgs {
			c.TakesArgs[i] = r.Intn(3) > 0
		}
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + mem.Bytes(r.Int63n(int64(top)))
		for _, st := range strategies {
			sol, err := st.solve(c, budget, 1+r.Intn(3), int(top))
			var inf *ErrInfeasible
			if errors.As(err, &inf) {
				if inf.MinBudget <= budget {
					t.Fatalf("chain %d, %s: infeasible at %d but min budget %d", k, st.name, budget, inf.MinBudget)
				}
				if again, err := st.solve(c, inf.MinBudget, 1, int(top)); st.name != "every-k" && (err != nil || again.Peak > inf.MinBudget) {
					t.Fatalf("chain %d, %s: min budget %d does not work: %v", k, st.name, inf.MinBudget, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("chain %d, %s: %v", k, st.name, err)
			}
			if sol.Peak > budget {
				t.Fatalf("chain %d, %s: peak %d over the budget %d", k, st.name, sol.Peak, budget)
			}
			without, err := Simulate(&plain, sol.Schedule)
			if err != nil {
				t.Fatal(err)
			}
			live, end := argsLive(c, sol.Schedule)
			for j := range sol.Schedule {
				got, base := sol.Timeline[j], without.Timeline[j]
				switch {
				case j == end && (got < base || got > base+c.ArgBytes),
					j != end && live[j] && got != base+c.ArgBytes,
					!live[j] && got != base:
					t.Fatalf("chain %d, %s, op %d (%v) of %v: %d with the arguments, %d without (live %v, freed after op %d)",
						k, st.name, j, sol.Schedule[j], sol.Schedule, got, base, live[j], end)
				}
			}
		}
	}
}
