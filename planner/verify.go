package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"

	"github.com/ckptplan/ckptplan/mem"
)

// A plan read from a file is a claim: that this schedule of this model's
// stages, under this setup, peaks at so many bytes within the budget and
// costs so much. Check tests the claims a plan makes about itself; Verify
// tests them against the model, planning the plan's schedule again on the
// problem rebuilt from the model and the plan's setup. A plan that fails
// either is refused with what differs, so that no export writes figures
// nobody computed.

// Check reports the first figure of plan that contradicts another or is
// out of range: a budget that is not positive, negative bytes or costs,
// static memory above the peak, a feasible plan whose peak and reserve
// pass its budget, an infeasible one, a setup that does not validate.
func (plan *Plan) Check() error {
	for _, f := range []struct {
		name string
		v    mem.Bytes
	}{{"reserve_bytes", plan.ReserveBytes}, {"static_bytes", plan.StaticBytes}, {"peak_bytes", plan.PeakBytes},
		{"activation_peak_bytes", plan.ActivationPeakBytes}, {"step_peak_bytes", plan.StepPeakBytes}, {"min_budget_bytes", plan.MinBudgetBytes}} {
		if f.v < 0 {
			return fmt.Errorf("%s is negative (%d)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"cost", plan.Cost}, {"baseline_cost", plan.BaselineCost}, {"overhead", plan.Overhead}} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%s is %v: a cost is finite and not negative", f.name, f.v)
		}
	}
	switch {
	case plan.BudgetBytes <= 0:
		return fmt.Errorf("budget_bytes is %d: a budget is positive", plan.BudgetBytes)
	case !plan.Feasible:
		return fmt.Errorf("the plan does not fit its budget of %v (feasible is false)", plan.BudgetBytes)
	case plan.ReserveBytes > plan.BudgetBytes || plan.PeakBytes > plan.BudgetBytes-plan.ReserveBytes:
		return fmt.Errorf("the plan says it fits, but its peak %v and reserve %v pass its budget %v", plan.PeakBytes, plan.ReserveBytes, plan.BudgetBytes)
	case plan.PagedOutBytes < 0 || plan.PagedOutBytes > plan.StaticBytes:
		return fmt.Errorf("paged_out_bytes %d is not a part of static_bytes %d", plan.PagedOutBytes, plan.StaticBytes)
	case plan.StaticBytes-plan.PagedOutBytes > plan.PeakBytes:
		return fmt.Errorf("static_bytes %v is above peak_bytes %v", plan.StaticBytes, plan.PeakBytes)
	}
	if plan.Runtime != "" {
		if err := checkRuntime(plan.Runtime); err != nil {
			return err
		}
	}
	if s := plan.Setup; s != nil {
		c := *s
		if err := c.Validate("setup"); err != nil {
			return err
		}
	}
	return nil
}

// ErrPlanMismatch is wrapped by Verify's errors for a plan whose figures
// are not its model's.
var ErrPlanMismatch = errors.New("the plan does not match its model")

// Verify plans plan's schedule again on p, the problem of the model the
// plan names under the plan's setup, and reports the first figure that
// differs: the setup, the stages, a keep set, the static memory, the
// peak, the cost or the baseline. It checks plan itself first (Check).
func (p *Problem) Verify(plan *Plan) error {
	if err := plan.Check(); err != nil {
		return err
	}
	if err := p.sameSetup(plan); err != nil {
		return err
	}
	if len(plan.Stages) != len(p.names) {
		return fmt.Errorf("%w %s: it has %d stages, the model %d", ErrPlanMismatch, p.Name, len(plan.Stages), len(p.names))
	}
	for i, st := range plan.Stages {
		if st.Name != p.names[i] {
			return fmt.Errorf("%w %s: its stage %d is %q, the model's %q", ErrPlanMismatch, p.Name, i, st.Name, p.names[i])
		}
		if st.Decision == DecisionSelective && p.Stages != nil {
			if _, ok := p.resolveKeepSet(plan, i, st.Option); !ok {
				return fmt.Errorf("%w %s: %s keeps %q, which is none of the model's keep sets of that stage", ErrPlanMismatch, p.Name, st.Name, st.Option)
			}
		}
	}
	sched, err := p.Schedule(plan)
	if err != nil {
		return fmt.Errorf("%w %s: %v", ErrPlanMismatch, p.Name, err)
	}
	again, err := p.PlanSchedule(plan.Solver, plan.BudgetBytes-plan.ReserveBytes, sched)
	if err != nil {
		return fmt.Errorf("%w %s: its schedule: %v", ErrPlanMismatch, p.Name, err)
	}
	if !again.Feasible {
		return fmt.Errorf("%w %s: its schedule needs %v, more than its budget %v", ErrPlanMismatch, p.Name, again.MinBudgetBytes, plan.BudgetBytes)
	}
	if err := sameStages(plan, again); err != nil {
		return fmt.Errorf("%w %s: %v", ErrPlanMismatch, p.Name, err)
	}
	for _, f := range []struct {
		name       string
		got, model mem.Bytes
	}{{"static_bytes", plan.StaticBytes, again.StaticBytes}, {"peak_bytes", plan.PeakBytes, again.PeakBytes},
		{"activation_peak_bytes", plan.ActivationPeakBytes, again.ActivationPeakBytes}, {"step_peak_bytes", plan.StepPeakBytes, again.StepPeakBytes},
		{"paged_out_bytes", plan.PagedOutBytes, again.PagedOutBytes}} {
		if f.got != f.model {
			return fmt.Errorf("%w %s: %s is %d, the model's is %d", ErrPlanMismatch, p.Name, f.name, f.got, f.model)
		}
	}
	for _, f := range []struct {
		name       string
		got, model float64
	}{{"cost", plan.Cost, again.Cost}, {"baseline_cost", plan.BaselineCost, again.BaselineCost}, {"paging_cost", plan.PagingCost, again.PagingCost}} {
		if math.Abs(f.got-f.model) > 1e-9*max(math.Abs(f.model), 1) {
			return fmt.Errorf("%w %s: %s is %v, the model's is %v", ErrPlanMismatch, p.Name, f.name, f.got, f.model)
		}
	}
	return nil
}

// sameSetup reports a plan whose setup is not the problem's, as their
// JSON says it.
func (p *Problem) sameSetup(plan *Plan) error {
	if plan.Setup == nil || p.Costs == nil || p.Costs.Graph.Setup.Batch == 0 {
		return nil
	}
	// LoRA's alpha changes no byte or FLOP, and a plan written before
	// setups recorded it has none: it is not compared.
	mine, model := *plan.Setup, p.Costs.Graph.Setup
	mine.LoRA.Alpha, model.LoRA.Alpha = 0, 0
	got, err1 := json.Marshal(mine)
	want, err2 := json.Marshal(model)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%w %s: its setup is %s, the model's %s", ErrPlanMismatch, p.Name, got, want)
	}
	return nil
}

// sameStages reports the first field of a stage of plan (its decision,
// keep set, sizes, costs) that is not the one the model's replay of the
// same schedule, again, records: what an export reads of each stage.
func sameStages(plan, again *Plan) error {
	for i := range plan.Stages {
		var got, want map[string]any
		if err := roundTrip(plan.Stages[i], &got); err != nil {
			return err
		}
		if err := roundTrip(again.Stages[i], &want); err != nil {
			return err
		}
		keys := make([]string, 0, len(got)+len(want))
		for k := range got {
			keys = append(keys, k)
		}
		for k := range want {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range slices.Compact(keys) {
			if !reflect.DeepEqual(got[k], want[k]) {
				g, _ := json.Marshal(got[k])
				w, _ := json.Marshal(want[k])
				return fmt.Errorf("its stage %s has %s %s, the model's %s", plan.Stages[i].Name, k, clip(g), clip(w))
			}
		}
	}
	return nil
}

// roundTrip decodes v's JSON into dst.
func roundTrip(v any, dst any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, dst)
}

// clip shortens a JSON value for a message.
func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	if len(b) == 0 {
		return "none"
	}
	return string(b)
}
