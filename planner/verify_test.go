package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// TestVerify: a plan read back from its JSON verifies against its model;
// each tampering, of its own figures or against the model's, is refused
// naming the figure.
func TestVerify(t *testing.T) {
	p := load(t, "tiny-llama")
	plan, err := p.Plan(&Options{Budget: 5 * mem.MiB})
	if err != nil || !plan.Feasible {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(plan); err != nil {
		t.Fatal(err)
	}
	read := func() *Plan {
		back, err := ReadPlan(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		return back
	}
	if err := p.Verify(read()); err != nil {
		t.Fatalf("the plan itself: %v", err)
	}
	// A plan written before setups recorded LoRA's alpha, which changes
	// nothing it plans, verifies.
	var old map[string]any
	if err := json.Unmarshal(buf.Bytes(), &old); err != nil {
		t.Fatal(err)
	}
	delete(old["setup"].(map[string]any)["lora"].(map[string]any), "alpha")
	before, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := ReadPlan(bytes.NewReader(before)); err != nil {
		t.Fatal(err)
	} else if err := p.Verify(back); err != nil {
		t.Errorf("a plan without LoRA's alpha: %v", err)
	}
	for _, tt := range []struct {
		name     string
		tamper   func(*Plan)
		want     string
		mismatch bool // against the model, not the plan's own figures
	}{
		{"peak over budget", func(q *Plan) { q.PeakBytes = 3 * q.BudgetBytes }, "pass its budget", false},
		{"negative budget", func(q *Plan) { q.BudgetBytes = -1 }, "budget_bytes is -1", false},
		{"negative static", func(q *Plan) { q.StaticBytes = -8 }, "static_bytes is negative", false},
		{"paged beyond static", func(q *Plan) { q.PagedOutBytes = q.StaticBytes + 1 }, "is not a part of static_bytes", false},
		{"paged", func(q *Plan) { q.PagedOutBytes = 1 }, "paged_out_bytes is 1, the model's is 0", true},
		{"infinite cost", func(q *Plan) { q.Cost = q.Cost / 0 }, "cost is +Inf", false},
		{"infeasible", func(q *Plan) { q.Feasible = false }, "does not fit its budget", false},
		{"bad setup", func(q *Plan) { q.Setup.Parallel.Zero = 7 }, "setup.parallel.zero", false},
		{"unknown runtime", func(q *Plan) { q.Runtime = "lazy" }, `unknown value "lazy"`, false},
		{"fewer stages", func(q *Plan) { q.Stages = q.Stages[:3] }, "it has 3 stages, the model 6", true},
		{"renamed stage", func(q *Plan) { q.Stages[2].Name = "layers.9" }, `its stage 2 is "layers.9"`, true},
		{"unknown keep set", func(q *Plan) { q.Stages[1].Decision, q.Stages[1].Option = DecisionSelective, "keep(nothing.here)" }, `keeps "keep(nothing.here)"`, true},
		{"lower peak", func(q *Plan) { q.PeakBytes -= 1024 }, "peak_bytes is", true},
		{"lower static", func(q *Plan) { q.StaticBytes -= 1 }, "static_bytes is", true},
		{"cheaper", func(q *Plan) { q.Cost *= 0.9 }, "cost is", true},
		{"other setup", func(q *Plan) { q.Setup.Seq *= 2 }, `its setup is {"batch":2,"seq":64`, true},
	} {
		q := read()
		tt.tamper(q)
		err := p.Verify(q)
		if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, ErrPlanMismatch) != tt.mismatch {
			t.Errorf("%s: %v, want %q (a mismatch with the model: %v)", tt.name, err, tt.want, tt.mismatch)
		}
	}
}
