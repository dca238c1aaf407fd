package solver

import (
	"errors"
	"math"
	"math/rand"
	"testing"
)

// TestStrategiesReplay: on random chains, every strategy's schedule replays
// within its budget at the reported cost, or the strategy says it cannot
// and names a minimum budget at which it can.
func TestStrategiesReplay(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for k := 0; k < 1000; k++ {
		c := randomChain(r, 1+r.Intn(12))
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + r.Int63n(top)
		for _, name := range Strategies {
			sol, err := Solve(c, name, budget, &Options{Slots: int(budget), K: 1 + r.Intn(3)})
			var inf *ErrInfeasible
			if errors.As(err, &inf) {
				if inf.MinBudget <= budget {
					t.Fatalf("chain %d, %s: infeasible at %d but min budget %d", k, name, budget, inf.MinBudget)
				}
				again, err := Solve(c, name, inf.MinBudget, &Options{Slots: int(inf.MinBudget), K: 1})
				if name != "every-k" && (err != nil || again.Peak > inf.MinBudget) {
					t.Fatalf("chain %d, %s: min budget %d does not work: %v", k, name, inf.MinBudget, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("chain %d, %s: %v", k, name, err)
			}
			res, err := Simulate(c, sol.Schedule)
			if err != nil || res.Cost != sol.Cost || res.Peak != sol.Peak || res.Peak > budget {
				t.Fatalf("chain %d, %s: replay %+v, %v; solution cost %v peak %d budget %d", k, name, res, err, sol.Cost, sol.Peak, budget)
			}
		}
	}
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
			for _, name := range Strategies[:len(Strategies)-1] {
				if b, err := Solve(c, name, budget, &Options{K: 2}); err == nil && b.Cost < cost {
					t.Fatalf("chain %d, budget %d: %s costs %v, optimal %v", k, budget, name, b.Cost, cost)
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
		budget := c.ActBytes[0] + r.Int63n(top)
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
		sol, err := Solve(c, "revolve", 1<<40, nil)
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
