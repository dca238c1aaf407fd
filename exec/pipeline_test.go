package exec

import (
	"fmt"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
)

// TestPipelineByExecution runs pipeline plans of both tiny models, under
// several budgets, strategies, pipeline sizes and both schedules, one
// tracker a device: each device's measured activation peak equals the
// plan's to the byte, and the gradients are bitwise those of the same
// microbatches run one after another storing everything.
func TestPipelineByExecution(t *testing.T) {
	type run struct {
		model    string
		profile  ir.Profile
		pp       planner.Pipeline
		strategy planner.Strategy
	}
	var runs []run
	for _, model := range []string{"tiny-llama", "tiny-gpt2"} {
		for _, profile := range []ir.Profile{"", ir.ProfileMegatron} {
			pps := []planner.Pipeline{{Stages: 2, Microbatches: 3}, {Stages: 2, Microbatches: 1}, {Stages: 1, Microbatches: 2}}
			if model == "tiny-llama" { // 4 layers
				pps = append(pps, planner.Pipeline{Stages: 4, Microbatches: 5}, planner.Pipeline{Stages: 2, Microbatches: 4, Schedule: "interleaved", Virtual: 2})
			}
			for _, pp := range pps {
				for _, s := range []planner.Strategy{planner.Selective, planner.Optimal, planner.EveryK, planner.StoreAll} {
					runs = append(runs, run{model, profile, pp, s})
				}
			}
		}
	}
	ran := 0
	for _, tt := range runs {
		src, err := graphio.Load(tt.model)
		if err != nil {
			t.Fatal(err)
		}
		if tt.profile != "" {
			src.Model.Training.Profile = tt.profile
		}
		p, err := planner.New(src)
		if err != nil {
			t.Fatal(err)
		}
		// From room for everything down to where a device no longer fits.
		free, err := p.PlanPipeline(&planner.Options{Budget: 1 << 40, Strategy: planner.StoreAll}, tt.pp)
		if err != nil {
			t.Fatal(err)
		}
		for _, frac := range []float64{1, 0.9, 0.8, 0.7} {
			budget := mem.Bytes(float64(free.PeakBytes) * frac)
			plan, err := p.PlanPipeline(&planner.Options{Budget: budget, Strategy: tt.strategy}, tt.pp)
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s %s %+v %s in %v", tt.model, tt.profile, tt.pp, tt.strategy.Name, budget)
			if !plan.Feasible {
				continue
			}
			ran++
			rep, err := VerifyPipeline(p, plan, 7)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for _, d := range rep.Devices {
				if d.MeasuredActivationPeakBytes != d.PredictedActivationPeakBytes {
					t.Errorf("%s: device %d measured %d B, plan %d B", name, d.Rank, d.MeasuredActivationPeakBytes, d.PredictedActivationPeakBytes)
				}
			}
			if !rep.GradientsMatch {
				t.Errorf("%s: gradients differ from the microbatches run in turn by up to %g", name, rep.MaxAbsGradDiff)
			}
		}
	}
	if ran < len(runs) {
		t.Errorf("%d plans ran for %d setups: the budgets leave setups unplanned", ran, len(runs))
	}
}
