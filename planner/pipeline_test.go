package planner

import (
	"math"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// gpt3 is GPT-3 175B as Korthikanti et al. 2022 study it: tensor
// parallel 8 with sequence parallelism, s = 2048, b = 1, the megatron
// profile.
func gpt3(t *testing.T) *Problem {
	t.Helper()
	src, err := graphio.Load("gpt3-175b")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Parallel.TP, src.Model.Training.Parallel.SP = 8, true
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPipelineMegatronFigures checks the first pipeline stage of GPT-3
// 175B against Megatron-LM's theoretical_memory_usage.py
// (compute_activation_memory, the formula of Korthikanti et al. 2022,
// Table 2, for the first stage): per-layer activations of sbh(18 +
// 4·ffn/h) = 34sbh under selective recomputation, times L layers (p
// microbatches in flight of L/p layers), plus the embedding's dropout mask
// sbh and token ids 8sb for each of p microbatches, discounted by m/p when
// fewer microbatches than stages run, all divided by t. Megatron divides
// the token ids by t too, though every tensor parallel rank holds them
// all, and leaves out the position ids GPT-3's learned position table
// reads: ckptplan holds 16sb a microbatch (token and position ids, int64)
// where the script counts 8sb/t — the one difference, stated here.
func TestPipelineMegatronFigures(t *testing.T) {
	p := gpt3(t)
	const s, b, h, ffn, L, tp = 2048, 1, 12288, 49152, 96, 8
	for _, m := range []int{64, 8, 4} {
		const pp = 8
		plan, err := p.PlanPipeline(&Options{Budget: 200 * mem.GiB, Strategy: MegatronSelective}, Pipeline{Stages: pp, Microbatches: m})
		if err != nil {
			t.Fatal(err)
		}
		inFlight := int64(min(m, pp))
		// Megatron's activation memory, in exact integers: each term times
		// min(1, m/p) is the same term for min(m, p) microbatches of L/p
		// layers.
		layers := int64(s*b*h*(18+4*ffn/h)) * L / pp * inFlight / tp
		embed := (int64(8*s*b) + int64(s*b*h)) * inFlight / tp
		megatron := layers + embed
		d := plan.Devices[0]
		c := d.Chunks[0]
		got := int64(c.HeldBytes) * int64(c.InFlight)
		if int64(c.InFlight) != inFlight {
			t.Errorf("m %d: %d microbatches in flight on the first stage, want min(m, p) = %d", m, c.InFlight, inFlight)
		}
		ids := inFlight * (16*s*b - 8*s*b/tp)
		if got != megatron+ids {
			t.Errorf("m %d: first stage holds %d B (%.2f MiB) for its microbatches in flight; Megatron-LM's figure %d B + the ids' %d B = %d", m, got, float64(got)/(1<<20), megatron, ids, megatron+ids)
		}
	}
}

// TestPipelineKorthikanti checks the first 1F1B stage against Korthikanti
// et al. 2022 (§4.2.3, Table 2, with sequence parallelism): holding p
// microbatches of L/p layers, it holds L layers' worth, sbhL(34 +
// 5as/h)/t storing everything and 2sbhL/t checkpointing every layer
// (only each layer's input), besides the embedding's mask and the ids.
func TestPipelineKorthikanti(t *testing.T) {
	p := gpt3(t)
	const s, b, h, a, L, tp, pp = 2048, 1, 12288, 96, 96, 8, 8
	for _, tt := range []struct {
		strategy Strategy
		perLayer int64
	}{
		{StoreAll, s * b * h * (34 + 5*a*s/h) / tp},
		{EveryK, 2 * s * b * h / tp},
	} {
		plan, err := p.PlanPipeline(&Options{Budget: 400 * mem.GiB, Strategy: tt.strategy}, Pipeline{Stages: pp, Microbatches: 64})
		if err != nil {
			t.Fatal(err)
		}
		c := plan.Devices[0].Chunks[0]
		embed := int64(16*s*b) + int64(s*b*h)/tp // ids, and the dropout mask a byte an element
		if got, want := int64(c.HeldBytes)*int64(c.InFlight), pp*embed+L*tt.perLayer; got != want {
			t.Errorf("%s: first stage holds %d B, want L·%d + p·%d = %d", tt.strategy.Name, got, tt.perLayer, embed, want)
		}
	}
}

// TestInterleavedFactor: Megatron-LM's interleaved schedule holds on the
// first device 1 + (p − 1)/(p·v) times the layers 1F1B holds there
// (Narayanan et al. 2021; Megatron-LM's interleaved memory penalty): at
// most (v·p + p − 1) chunks of L/(p·v) layers in flight at once.
func TestInterleavedFactor(t *testing.T) {
	for _, tt := range []struct{ p, v, m int }{{8, 2, 64}, {4, 3, 8}, {2, 2, 4}, {8, 4, 16}} {
		pp := Pipeline{Stages: tt.p, Virtual: tt.v, Microbatches: tt.m, Schedule: "interleaved"}
		most, n := 0, 0
		for _, op := range pp.Order(0) {
			if op.Forward {
				n++
				most = max(most, n)
			} else {
				n--
			}
		}
		// Layers held over the L of 1F1B: most·L/(p·v) / L = 1 + (p−1)/(p·v).
		if most != tt.v*tt.p+tt.p-1 {
			t.Errorf("p %d v %d: %d chunks in flight at most, want v·p + p − 1 = %d", tt.p, tt.v, most, tt.v*tt.p+tt.p-1)
		}
	}
}

// TestPipelineOrder: every device runs each chunk's forward and backward
// once for every microbatch, a backward after its forward, and under
// 1F1B device k holds at most min(p − k, m) microbatches.
func TestPipelineOrder(t *testing.T) {
	for _, pp := range []Pipeline{{Stages: 4, Microbatches: 8, Virtual: 1}, {Stages: 4, Microbatches: 2, Virtual: 1},
		{Stages: 4, Microbatches: 8, Virtual: 2, Schedule: "interleaved"}, {Stages: 3, Microbatches: 3, Virtual: 3, Schedule: "interleaved"}} {
		for rank := 0; rank < pp.Stages; rank++ {
			order := pp.Order(rank)
			done := map[[2]int]int{}
			for _, op := range order {
				k := [2]int{op.Chunk, op.Micro}
				if op.Forward != (done[k] == 0) {
					t.Fatalf("%+v rank %d: %+v out of order", pp, rank, op)
				}
				done[k]++
			}
			if len(done) != pp.Microbatches*pp.Virtual || len(order) != 2*len(done) {
				t.Fatalf("%+v rank %d: %d ops for %d chunk-microbatches", pp, rank, len(order), len(done))
			}
			if pp.Virtual == 1 {
				if n := inFlight(order, 1)[0]; n != min(pp.Stages-rank, pp.Microbatches) {
					t.Errorf("%+v rank %d: %d in flight, want %d", pp, rank, n, min(pp.Stages-rank, pp.Microbatches))
				}
			}
		}
	}
}

// TestPipelineStaticBytes: each device's static memory is Megatron-LM's
// 18 bytes a parameter (bf16 weights, fp32 gradients, fp32 master copy
// and two moments), 6 + 12/dp with the distributed optimizer (ZeRO 1);
// the devices' parameters add up to the model's, the last device holding
// a copy of the tied embedding for its head.
func TestPipelineStaticBytes(t *testing.T) {
	for _, zero := range []int64{0, 1} {
		src, err := graphio.Load("gpt3-175b")
		if err != nil {
			t.Fatal(err)
		}
		src.Model.Training.Parallel.Zero, src.Model.Training.Parallel.DP = zero, 64
		p, err := New(src)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := p.PlanPipeline(&Options{Budget: 1 << 50, Strategy: StoreAll}, Pipeline{Stages: 8, Microbatches: 8})
		if err != nil {
			t.Fatal(err)
		}
		var params int64
		for _, d := range plan.Devices {
			st := d.Static
			if st.GradientsBytes != 2*st.WeightsBytes {
				t.Errorf("zero %d stage %d: gradients %d B for weights %d B, want fp32 (2×)", zero, d.Rank, st.GradientsBytes, st.WeightsBytes)
			}
			want := 6 * st.WeightsBytes
			if zero == 1 {
				want = (want + 63) / 64
			}
			if st.OptimizerBytes != want {
				t.Errorf("zero %d stage %d: optimizer %d B, want %d", zero, d.Rank, st.OptimizerBytes, want)
			}
			params += st.Parameters
		}
		wte := int64(51200 * 12288)
		if total := p.Costs.Static.Parameters; params != total+wte {
			t.Errorf("devices hold %d parameters, want the model's %d and the last stage's copy of the embedding, %d", params, total, total+wte)
		}
	}
}

// TestPipelineReplayIsBound: under 1F1B a device's replayed peak is
// exactly the bound SolveInFlight keeps within the budget, (n − 1)
// microbatches held while the n-th runs; the plan fits every budget it
// says it fits, and one device of one microbatch stores as the
// single-device plan does.
func TestPipelineReplayIsBound(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-gpt2"} {
		p := load(t, name)
		for _, budget := range []mem.Bytes{2 * mem.MiB, 3 * mem.MiB, 4 * mem.MiB, 8 * mem.MiB} {
			for _, pp := range []Pipeline{{Stages: 2, Microbatches: 4}, {Stages: 2, Microbatches: 1}, {Stages: 1, Microbatches: 3}} {
				plan, err := p.PlanPipeline(&Options{Budget: budget}, pp)
				if err != nil {
					t.Fatal(err)
				}
				for k, d := range plan.Devices {
					if !d.Feasible {
						continue
					}
					// Σ n·H + max (P − H) over the device's chunks, from what the
					// plan records of each.
					var segs []solver.Segment
					var ms []solver.SegmentMemory
					for _, c := range d.Chunks {
						segs = append(segs, solver.Segment{InFlight: c.InFlight})
						ms = append(ms, solver.SegmentMemory{Held: c.HeldBytes, Forward: c.ForwardPeakBytes, Backward: c.BackwardPeakBytes})
					}
					bound := solver.InFlightBound(segs, ms)
					if d.ActivationPeakBytes != bound || d.PeakBytes > budget {
						t.Errorf("%s %+v in %v, stage %d: peak %d (activations %d), bound %d", name, pp, budget, k, d.PeakBytes, d.ActivationPeakBytes, bound)
					}
				}
			}
		}
		one, err := p.PlanPipeline(&Options{Budget: 1 << 40, Strategy: StoreAll}, Pipeline{Stages: 1, Microbatches: 1})
		if err != nil {
			t.Fatal(err)
		}
		// A pipeline holds its gradients through the step.
		held, err := p.Accumulating(2)
		if err != nil {
			t.Fatal(err)
		}
		single, err := held.Plan(&Options{Budget: 1 << 40, Strategy: StoreAll})
		if err != nil {
			t.Fatal(err)
		}
		if d := one.Devices[0]; d.PeakBytes != single.PeakBytes || d.Cost != single.Cost {
			t.Errorf("%s: one device, one microbatch: peak %d cost %v, the single-device plan %d %v", name, d.PeakBytes, d.Cost, single.PeakBytes, single.Cost)
		}
	}
}

// TestPipelineRefuses: pipelines that cannot be planned say why.
func TestPipelineRefuses(t *testing.T) {
	p := load(t, "tiny-llama") // 4 layers
	for _, tt := range []struct {
		pp       Pipeline
		strategy Strategy
		k        int
		want     string
	}{
		{Pipeline{Stages: 5, Microbatches: 5}, Selective, 0, "cannot fill 5 pipeline chunks"},
		{Pipeline{Stages: 2, Microbatches: 4, Layers: []int{1, 2}}, Selective, 0, "add up to 3"},
		{Pipeline{Stages: 2, Microbatches: 4, Layers: []int{4, 0}}, Selective, 0, "at least one"},
		{Pipeline{Stages: 2, Microbatches: 4, Layers: []int{4}}, Selective, 0, "1 layer counts given for 2"},
		{Pipeline{Stages: 2, Microbatches: 3, Schedule: "interleaved", Virtual: 2}, Selective, 0, "not a multiple"},
		{Pipeline{Stages: 2, Microbatches: 4, Schedule: "interleaved", Virtual: 1}, Selective, 0, "at least 2 virtual"},
		{Pipeline{Stages: 2, Microbatches: 4, Virtual: 2}, Selective, 0, "need the interleaved"},
		{Pipeline{Stages: 2, Microbatches: 4, Schedule: "gpipe"}, Selective, 0, "unknown pipeline schedule"},
		{Pipeline{Stages: 0, Microbatches: 4}, Selective, 0, "at least one stage"},
		{Pipeline{Stages: 2, Microbatches: MaxMicrobatches + 1}, Selective, 0, "65537 microbatches a step: ckptplan plans at most 65536"},
		{Pipeline{Stages: 2, Microbatches: 4, Schedule: "interleaved", Virtual: math.MaxInt/2 + 1}, Selective, 0, "cannot fill 2 pipeline stages × 4611686018427387904 virtual"},
		{Pipeline{Stages: 2, Microbatches: 4, Layers: []int{math.MaxInt, math.MaxInt}}, Selective, 0, "chunk 0 has 9223372036854775807 layers, but the model has 4"},
		{Pipeline{Stages: 2, Microbatches: 4}, Sqrt, 0, "does not apply"},
		{Pipeline{Stages: 2, Microbatches: 4}, EveryK, 2, "every layer (k 1)"},
	} {
		_, err := p.PlanPipeline(&Options{Budget: mem.GiB, Strategy: tt.strategy, K: tt.k}, tt.pp)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v %s: error %v, want %q", tt.pp, tt.strategy.Name, err, tt.want)
		}
	}
}

// TestPipelineForMegatron: a plan Megatron-LM can say is run as planned;
// otherwise the setting chosen fits every device and costs no more than
// any other that fits.
func TestPipelineForMegatron(t *testing.T) {
	p := gpt3(t)
	pp := Pipeline{Stages: 8, Microbatches: 64}
	exact, err := p.PlanPipelineForMegatron(&Options{Device: "h100-80gb", Strategy: MegatronSelective}, pp)
	if err != nil {
		t.Fatal(err)
	}
	if !exact.Exact || exact.Setting != (MegatronRecompute{Modules: costmodel.CoreAttn}) || exact.Runs.Cost != exact.Plan.Cost {
		t.Errorf("megatron-selective plan: exact %v, setting %v, cost %v against the plan's %v", exact.Exact, exact.Setting, exact.Runs.Cost, exact.Plan.Cost)
	}
	o := &Options{Budget: 55 * mem.GiB}
	closest, err := p.PlanPipelineForMegatron(o, pp)
	if err != nil {
		t.Fatal(err)
	}
	if closest.Exact || !closest.Runs.Feasible || closest.Runs.PeakBytes > o.Budget {
		t.Fatalf("in 55 GiB: exact %v, feasible %v, peak %v", closest.Exact, closest.Runs.Feasible, closest.Runs.PeakBytes)
	}
	for _, r := range append([]MegatronRecompute{{}, {Block: 1}, {Block: 6}, {Block: 12}}, MegatronSelectiveSettings()...) {
		other, err := p.PlanPipelineWith(o, pp, r)
		if err != nil {
			t.Fatal(err)
		}
		if other.Feasible && other.Cost < closest.Runs.Cost {
			t.Errorf("%v fits at cost %v, below the chosen %v's %v", r, other.Cost, closest.Setting, closest.Runs.Cost)
		}
	}
}

// TestPipelineCallArgsInFlight: under the transformers profile each
// chunk's forward makes the call arguments (eager attention's mask and
// the positions) for each microbatch, and its checkpointed layers' calls
// hold them to their backward, so a device holds one copy for each
// microbatch in flight: checkpointing every layer of tiny-llama, each
// device's activation peak is the one without the arguments plus the
// arguments times its microbatches in flight, and its static memory has
// none of them.
func TestPipelineCallArgsInFlight(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Profile, src.Model.Training.Attention = "transformers", "eager"
	// Gradients held through the microbatches already: the pipeline
	// plans this problem, not one rebuilt to hold them.
	src.Model.Training.GradAccum = 4
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	args := p.Chain.ArgBytes
	if args < mem.Bytes(src.Model.Training.Seq*src.Model.Training.Seq) {
		t.Fatalf("call arguments %v: no eager mask", args)
	}
	pp := Pipeline{Stages: 2, Microbatches: 4}
	opt := &Options{Budget: mem.GiB, Strategy: EveryK, K: 1}
	with, err := p.PlanPipeline(opt, pp)
	if err != nil {
		t.Fatal(err)
	}
	p.Chain.ArgBytes = 0
	without, err := p.PlanPipeline(opt, pp)
	if err != nil {
		t.Fatal(err)
	}
	for r, d := range with.Devices {
		w := without.Devices[r]
		if d.StaticBytes != w.StaticBytes || d.StaticBytes != mem.Bytes(d.Static.Total()) {
			t.Errorf("device %d: static %v with the arguments, %v without, %v counted", r, d.StaticBytes, w.StaticBytes, d.Static.Total())
		}
		n := mem.Bytes(d.Chunks[0].InFlight)
		if got := d.ActivationPeakBytes - w.ActivationPeakBytes; got != n*args {
			t.Errorf("device %d: the arguments add %v to its peak, want %d in flight × %v", r, got, n, args)
		}
	}
	if with.Devices[0].Chunks[0].InFlight < 2 {
		t.Errorf("the first device holds %d microbatches: the test tests one copy", with.Devices[0].Chunks[0].InFlight)
	}
}
