package exec

import (
	"fmt"
	"math"
	"time"

	"github.com/ckptplan/ckptplan/exec/gemm"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// MaxRunBytes is the largest predicted peak Verify accepts: the executor
// runs on the CPU in float32, for small models.
const MaxRunBytes = 4 << 30

// Report is what a run of a plan measured against what the plan
// predicted. Its JSON names are part of the plan format.
type Report struct {
	Model                        string    `json:"model"`
	Solver                       string    `json:"solver"`
	BudgetBytes                  mem.Bytes `json:"budget_bytes"`
	PredictedPeakBytes           mem.Bytes `json:"predicted_peak_bytes"`
	MeasuredPeakBytes            mem.Bytes `json:"measured_peak_bytes"`
	PredictedActivationPeakBytes mem.Bytes `json:"predicted_activation_peak_bytes"`
	MeasuredActivationPeakBytes  mem.Bytes `json:"measured_activation_peak_bytes"`
	// ExecutorWorkspaceBytes is the executor's own memory (the matrix
	// kernels' packing buffers), measured apart from the model's.
	ExecutorWorkspaceBytes mem.Bytes   `json:"executor_workspace_bytes"`
	MatmulKernel           string      `json:"matmul_kernel"`
	TimelineMatches        bool        `json:"timeline_matches"` // every op's peak as predicted
	GradientsMatch         bool        `json:"gradients_match"`  // bitwise equal to storing everything
	MaxAbsGradDiff         float64     `json:"max_abs_grad_diff"`
	PredictedCost          float64     `json:"predicted_cost"`
	MeasuredCost           float64     `json:"measured_cost"` // FLOPs the kernels ran
	Loss                   float32     `json:"loss"`
	Seconds                float64     `json:"seconds"`            // wall time of the planned step
	BaselineSeconds        float64     `json:"baseline_seconds"`   // of the store-everything step
	Predicted              []mem.Bytes `json:"predicted_timeline"` // per op, static included
	Measured               []mem.Bytes `json:"measured_timeline"`
	Ops                    []string    `json:"ops"`
}

// Verify runs a plan's schedule and the store-everything schedule with the
// same seeded weights and data, and reports the memory, cost and
// gradients measured against the plan's predictions.
func Verify(p *planner.Problem, plan *planner.Plan, seed int64) (*Report, error) {
	if !plan.Feasible {
		return nil, fmt.Errorf("the plan does not fit its budget: nothing to run")
	}
	if plan.PeakBytes > MaxRunBytes {
		return nil, fmt.Errorf("%s needs %d bytes under this plan, more than the %d the CPU executor runs: try a tiny model (tiny-gpt2, tiny-llama) or a shorter --seq", p.Name, plan.PeakBytes, int64(MaxRunBytes))
	}
	sched, err := p.Schedule(plan)
	if err != nil {
		return nil, err
	}
	sim, err := solver.Simulate(p.Chain, sched)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	ref, refSecs, err := timedRun(p, solver.StoreAll(p.Chain), seed)
	if err != nil {
		return nil, err
	}
	r, secs, err := timedRun(p, sched, seed)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Model: p.Name, Solver: plan.Solver, BudgetBytes: plan.BudgetBytes,
		PredictedPeakBytes: sim.Peak + p.Static, MeasuredPeakBytes: r.tr.Peak(),
		PredictedActivationPeakBytes: sim.Peak, MeasuredActivationPeakBytes: r.tr.Peak() - p.Static,
		PredictedCost: sim.Cost, MeasuredCost: float64(r.kernelFLOPs), Loss: r.loss,
		Seconds: secs, BaselineSeconds: refSecs,
		ExecutorWorkspaceBytes: r.tr.Overhead(), MatmulKernel: gemm.Kernel(),
		TimelineMatches: len(r.tr.Timeline) == len(sim.Timeline),
	}
	for k, s := range r.tr.Timeline {
		rep.Ops = append(rep.Ops, s.Label)
		rep.Measured = append(rep.Measured, s.Peak)
		rep.Predicted = append(rep.Predicted, sim.Timeline[k]+p.Static)
		rep.TimelineMatches = rep.TimelineMatches && s.Peak == sim.Timeline[k]+p.Static
	}
	rep.GradientsMatch, rep.MaxAbsGradDiff = compareGradients(gradients(ref), gradients(r))
	return rep, nil
}

// compareGradients reports whether two runs' gradients are bitwise equal,
// and their largest difference.
func compareGradients(a, b [][]float32) (equal bool, maxDiff float64) {
	equal = true
	for i := range a {
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				equal = false
			}
			maxDiff = max(maxDiff, math.Abs(float64(a[i][j])-float64(b[i][j])))
		}
	}
	return equal, maxDiff
}

func timedRun(p *planner.Problem, s solver.Schedule, seed int64) (*Runner, float64, error) {
	r, err := NewRunner(p, seed)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	err = r.Step(s)
	return r, time.Since(start).Seconds(), err
}

// gradients returns a copy of every parameter gradient of a run.
func gradients(r *Runner) [][]float32 {
	var out [][]float32
	for _, p := range r.params {
		for _, g := range [][]float32{p.dw, p.db, p.dLoraA, p.dLoraB} {
			if g != nil {
				out = append(out, append([]float32(nil), g...))
			}
		}
	}
	return out
}
