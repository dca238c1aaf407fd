package planner

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// BenchmarkPlan70B plans llama-3-70b (82 stages, 8k tokens) end to end at
// the default slot count, with 40 GiB for activations (eager attention's
// s² scores need more: 2 TiB): graph, costs, keep
// sets, chain, table, schedule, and the baselines the strategy compares
// itself with; the layer-level optimal strategy and the selective one,
// with flash and eager attention; on the whole step's timeline (step:
// gradients made in the backward, the optimizer step) and, to compare,
// with the gradients held the whole step and no optimizer (held).
func BenchmarkPlan70B(b *testing.B) {
	for _, attention := range []ir.AttentionKernel{ir.AttentionFlash, ir.AttentionEager} {
		for _, strategy := range []Strategy{Optimal, Selective} {
			for _, timeline := range []string{"step", "held"} {
				b.Run(attention.String()+"/"+strategy.Name+"/"+timeline, func(b *testing.B) {
					benchPlan70B(b, attention, strategy, timeline == "held")
				})
			}
		}
	}
}

func benchPlan70B(b *testing.B, attention ir.AttentionKernel, strategy Strategy, held bool) {
	src, err := graphio.Load("llama-3-70b")
	if err != nil {
		b.Fatal(err)
	}
	if held {
		src.Model.Training.Optimizer = "none"
	}
	src.Model.Training.Attention = attention
	act := mem.Bytes(40 << 30)
	if attention == ir.AttentionEager {
		act = 2 << 40
	}
	for b.Loop() {
		p, err := New(src)
		if err != nil {
			b.Fatal(err)
		}
		// act for activations beyond what the optimizer step
		// holds: every gradient, the weights and state.
		plan, err := p.Plan(&Options{Budget: p.StepPeak + act, Strategy: strategy})
		if err != nil || !plan.Feasible {
			b.Fatal(err, plan.MinBudgetBytes)
		}
	}
}

// BenchmarkPlanLongChain plans a random 600-stage profiled chain (outputs
// of 1–4 MiB, tapes up to 8 MiB more, transients up to 4 MiB, costs with
// fractions) with the selective strategy at the default slots, end to end,
// at budgets from a tenth of storing everything to nearly all of it.
func BenchmarkPlanLongChain(b *testing.B) {
	r := rand.New(rand.NewSource(600))
	ch := &graphio.Chain{Name: "random600", Unit: "ms", InputBytes: mem.Bytes(1+r.Intn(4)) * mem.MiB}
	for i := range 600 {
		out := mem.Bytes(1+r.Intn(4)) * mem.MiB
		ch.Stages = append(ch.Stages, graphio.ChainStage{
			Name: fmt.Sprint("s", i), Forward: float64(1+r.Intn(100)) + 0.25, Backward: float64(1 + r.Intn(200)),
			OutputBytes: out, SavedBytes: out + mem.Bytes(r.Intn(9))*mem.MiB,
			ForwardTempBytes: mem.Bytes(r.Intn(5)) * mem.MiB, BackwardTempBytes: mem.Bytes(r.Intn(5)) * mem.MiB,
		})
	}
	src := &graphio.Source{Name: ch.Name, Kind: graphio.KindChain, Chain: ch}
	p, err := New(src)
	if err != nil {
		b.Fatal(err)
	}
	all, err := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
	if err != nil {
		b.Fatal(err)
	}
	for _, percent := range []mem.Bytes{10, 25, 50, 75, 95} {
		b.Run(fmt.Sprintf("%d%%", percent), func(b *testing.B) {
			for b.Loop() {
				p, err := New(src)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := p.Plan(&Options{Budget: all.Peak / 100 * percent}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// h100Roofline is the H100's roofline for the time objective, nil for
// FLOPs.
func h100Roofline(objective string) *costmodel.Roofline {
	if objective != "time" {
		return nil
	}
	d, _ := costmodel.LookupDevice("h100-80gb")
	r, _ := d.Roofline()
	return &r
}

// BenchmarkFit70B answers fit for llama-3-70b on 80 GiB GPUs: the largest
// micro-batch and sequence of the base setup, storing everything and
// planned, and every setting (full, 8-bit AdamW, LoRA, QLoRA; DDP,
// ZeRO 1 to 3, tensor parallelism and pipelines over 8 GPUs) reaching a global batch of 64 sequences of
// 4096 tokens, in FLOPs and in time on the H100's roofline.
func BenchmarkFit70B(b *testing.B) {
	for _, objective := range []string{"flops", "time"} {
		b.Run(objective, func(b *testing.B) {
			src, err := graphio.Load("llama-3-70b")
			if err != nil {
				b.Fatal(err)
			}
			r := h100Roofline(objective)
			build, err := ModelBuilder(src, r)
			if err != nil {
				b.Fatal(err)
			}
			base := src.Model.Training
			base.Seq = 4096
			for b.Loop() {
				fit, err := build.Fit(base, &Options{Device: "h100-80gb"}, FitOptions{GPUs: 8, GlobalBatch: 64})
				if err != nil || fit.LeastChange < 0 {
					b.Fatal(err, fit)
				}
			}
		})
	}
}

// BenchmarkPipeline175B plans GPT-3 175B over 8 pipeline stages of TP 8
// with sequence parallelism, 64 microbatches, on an H100's 80 GB with the
// selective strategy (plan gpt3-175b --tp 8 --sp --pp 8 --microbatches 64
// --device h100-80gb): in FLOPs, and in time on the H100's roofline,
// whose distinct costs make the in-flight solver's fronts far wider.
func BenchmarkPipeline175B(b *testing.B) {
	for _, objective := range []string{"flops", "time"} {
		b.Run(objective, func(b *testing.B) {
			src, err := graphio.Load("gpt3-175b")
			if err != nil {
				b.Fatal(err)
			}
			src.Model.Training.Parallel.TP, src.Model.Training.Parallel.SP = 8, true
			r := h100Roofline(objective)
			p, err := NewTimed(src, r)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				plan, err := p.PlanPipeline(&Options{Device: "h100-80gb", Strategy: Selective}, Pipeline{Stages: 8, Microbatches: 64})
				if err != nil || !plan.Feasible {
					b.Fatal(err, plan.Feasible)
				}
			}
		})
	}
}
