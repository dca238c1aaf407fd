package exec

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// variant is a tiny model under one training setup.
type variant struct {
	model     string
	profile   ir.Profile
	attention ir.AttentionKernel
	dropout   float64
	lora      int64
	loraDrop  float64
}

func (v variant) String() string {
	return fmt.Sprintf("%s/%s/%s/p%g/lora%d", v.model, v.profile, v.attention, v.dropout, v.lora)
}

func (v variant) problem(t *testing.T) *planner.Problem {
	t.Helper()
	src, err := graphio.Load(v.model)
	if err != nil {
		t.Fatal(err)
	}
	tr := &src.Model.Training
	tr.Attention, tr.Dropout = v.attention, v.dropout
	if v.profile != "" {
		tr.Profile = v.profile
	}
	tr.LoRA.Rank, tr.LoRA.Dropout = v.lora, v.loraDrop
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, p *planner.Problem, s solver.Schedule) *Runner {
	t.Helper()
	r, err := NewRunner(p, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Step(s); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMeasuredEqualsPredicted runs every strategy at a sweep of budgets on
// the tiny models under several setups, and checks that the executor's
// measured peak and per-op peaks equal the simulator's to the byte, that
// the gradients are bitwise those of storing everything, and that the
// FLOPs run equal the plan's cost.
func TestMeasuredEqualsPredicted(t *testing.T) {
	variants := []variant{
		{"tiny-llama", "", "eager", 0, 0, 0},
		{"tiny-llama", "", "eager", 0.1, 0, 0},
		{"tiny-llama", "", "flash", 0, 0, 0},
		{"tiny-llama", "", "eager", 0, 4, 0},
		{"tiny-llama", "", "flash", 0, 4, 0.05},
		{"tiny-gpt2", "", "eager", 0, 0, 0},
		{"tiny-gpt2", "", "eager", 0.1, 0, 0},
		{"tiny-gpt2", "", "flash", 0, 0, 0},
		{"tiny-gpt2", "", "eager", 0.1, 8, 0},
		{"tiny-gpt2", "megatron", "eager", 0.1, 0, 0},
		{"tiny-llama", "megatron", "eager", 0.1, 0, 0},
		{"tiny-llama", "megatron", "flash", 0, 4, 0},
	}
	for _, v := range variants {
		t.Run(v.String(), func(t *testing.T) {
			p := v.problem(t)
			all := solver.StoreAll(p.Chain)
			ref := run(t, p, all)
			want := gradients(ref)
			top, _ := solver.Simulate(p.Chain, all)
			low := top.Peak
			if plan, err := p.Plan(&planner.Options{Budget: p.Static + 1, Strategy: planner.Optimal}); err != nil || plan.Feasible {
				t.Fatalf("1 byte for activations: %v, feasible %v", err, plan.Feasible)
			} else {
				low = plan.MinBudgetBytes - p.Static
			}
			checked := 0
			check := func(name string, sched solver.Schedule, sim solver.Result) {
				t.Helper()
				r := run(t, p, sched)
				if got, want := r.tr.Peak(), sim.Peak+p.Static; got != want {
					t.Fatalf("%s: measured peak %d, predicted %d", name, got, want)
				}
				for j, s := range r.tr.Timeline {
					if s.Peak != sim.Timeline[j]+p.Static {
						t.Fatalf("%s: op %d %s peaks at %d, predicted %d", name, j, s.Label, s.Peak, sim.Timeline[j]+p.Static)
					}
				}
				if r.flops != int64(sim.Cost) || r.kernelFLOPs != int64(sim.Cost) {
					t.Errorf("%s: kernels counted %d FLOPs (nodes run: %d), plan says %v", name, r.kernelFLOPs, r.flops, sim.Cost)
				}
				got := gradients(r)
				for i := range want {
					for j := range want[i] {
						if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
							t.Fatalf("%s: gradient %d[%d] = %v, storing everything gives %v", name, i, j, got[i][j], want[i][j])
						}
					}
				}
				checked++
			}
			for k := 0; k <= 10; k++ {
				budget := low + (top.Peak-low)*mem.Bytes(k)/10
				for _, s := range planner.Strategies {
					plan, err := p.Plan(&planner.Options{Budget: p.Static + budget, Strategy: s, K: 2})
					if err != nil || !plan.Feasible {
						continue
					}
					sched, err := p.Schedule(plan)
					if err != nil {
						t.Fatal(err)
					}
					sim, err := solver.Simulate(p.Chain, sched)
					if err != nil {
						t.Fatal(err)
					}
					check(fmt.Sprintf("%s at %d", s.Name, budget), sched, sim)
				}
			}
			// Every keep set of every stage, each stage storing with its
			// k-th (or last) one.
			for k := 1; ; k++ {
				opts := make([]int, p.Chain.Len())
				more := false
				for i := range opts {
					opts[i] = min(k, p.Chain.NumOptions(i)-1)
					more = more || k < p.Chain.NumOptions(i)
				}
				if !more {
					break
				}
				sched := solver.StoreAllWith(p.Chain, opts)
				sim, err := solver.Simulate(p.Chain, sched)
				if err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("keep sets %v", opts), sched, sim)
			}
			if checked < 10 {
				t.Errorf("only %d feasible plans checked", checked)
			}
		})
	}
}

func TestFlashDropoutRefused(t *testing.T) {
	p := variant{"tiny-gpt2", "", "flash", 0.1, 0, 0}.problem(t)
	if _, err := NewRunner(p, 1); err == nil {
		t.Error("flash attention with dropout accepted")
	}
}

// TestStridedPointwiseRefused: Phi-3's SiLU reads the gate, a strided
// part of the fused gate/up projection, which the pointwise kernels cannot.
func TestStridedPointwiseRefused(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Family = "phi3"
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewRunner(p, 1); err == nil || !strings.Contains(err.Error(), "mlp.silu") {
		t.Errorf("NewRunner = %v, want a refusal naming the SiLU", err)
	}
}

// TestUnusualShapes runs setups that take paths of their own: one
// key/value head, where repeat_kv is a view with a zero stride (which the
// products read as it is for one sequence and copy for two); and a GPT-2 whose vocabulary is smaller than its position
// table, whose targets must stay within the vocabulary.
func TestUnusualShapes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		model string
		edit  func(*graphio.Model)
	}{
		{"one kv head, batch 1", "tiny-llama", func(m *graphio.Model) { m.KVHeads, m.Training.Batch = 1, 1 }},
		{"one kv head, batch 2", "tiny-llama", func(m *graphio.Model) { m.KVHeads, m.Training.Batch = 1, 2 }},
		{"vocabulary below positions", "tiny-gpt2", func(m *graphio.Model) { m.Vocab = 16 }},
		// Gemma's norm scales by 1 + w: the executor's weight plays 1 + w.
		{"gemma", "tiny-llama", func(m *graphio.Model) { m.Family, m.HeadSize = "gemma", 32 }},
		// Gemma 2's soft-capped scores and logits: tanh keeps its output,
		// which its backward reads.
		{"gemma2", "tiny-llama", func(m *graphio.Model) {
			m.Family, m.HeadSize, m.AttnSoftcap, m.FinalSoftcap, m.QueryScalar, m.SlidingWindow = "gemma2", 32, 5, 3, 24, 8
		}},
		// Qwen 3 normalizes each query and key head: RMS norms over d
		// with weights of their own.
		{"qwen3", "tiny-llama", func(m *graphio.Model) { m.Family, m.HeadSize = "qwen3", 32 }},
		// Mixtral's experts: tokens routed by their own top 2 of 4,
		// renormalized; the routing state (indices, route) is int64.
		{"mixtral", "tiny-llama", func(m *graphio.Model) { m.Experts, m.ExpertsPerToken, m.NormTopK = 4, 2, true }},
		// Qwen2-MoE's: top 3 of 5 without renormalizing, a shared expert
		// under a sigmoid gate, and a dense layer.
		{"qwen2_moe", "tiny-llama", func(m *graphio.Model) {
			m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.SharedExpertFFN, m.DenseLayers = 5, 3, 48, 80, []int64{1}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src, err := graphio.Load(tt.model)
			if err != nil {
				t.Fatal(err)
			}
			tt.edit(src.Model)
			verifyShare(t, src, 3)
		})
	}
}

// verifyShare plans src at quarters/4 of the way from the least budget
// any plan needs to what storing everything holds, runs the plan and
// checks the measured peak, timeline, FLOPs and gradients against the
// predicted.
func verifyShare(t *testing.T, src *graphio.Source, quarters mem.Bytes) {
	t.Helper()
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
	least, err := p.Plan(&planner.Options{Budget: 1})
	if err != nil || least.MinBudgetBytes == 0 {
		t.Fatalf("%v, least budget %d", err, least.MinBudgetBytes)
	}
	low := least.MinBudgetBytes
	plan, err := p.Plan(&planner.Options{Budget: low + (max(p.Static+all.Peak, p.StepPeak)-low)*quarters/4})
	if err != nil || !plan.Feasible {
		t.Fatalf("%v, feasible %v", err, plan.Feasible)
	}
	rep, err := Verify(p, plan, 3)
	if err != nil {
		t.Fatal(err)
	}
	if rep.MeasuredPeakBytes != rep.PredictedPeakBytes || !rep.TimelineMatches || !rep.GradientsMatch || rep.MeasuredCost != rep.PredictedCost {
		t.Errorf("measured %d, predicted %d; timeline %v gradients %v; FLOPs %v vs %v",
			rep.MeasuredPeakBytes, rep.PredictedPeakBytes, rep.TimelineMatches, rep.GradientsMatch, rep.MeasuredCost, rep.PredictedCost)
	}
}

// TestGraphs runs graph YAMLs under a plan at a share of what storing
// everything holds: a mixture of experts written op by op, and a norm of
// the graph's input (whose gradient nothing needs).
func TestGraphs(t *testing.T) {
	for _, tt := range []struct {
		file  string
		share mem.Bytes // in quarters
	}{{"moe.yaml", 3}, {"norm-input.yaml", 4}} {
		t.Run(tt.file, func(t *testing.T) {
			src, err := graphio.Load("../graphio/testdata/graphs/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			verifyShare(t, src, tt.share)
		})
	}
}
