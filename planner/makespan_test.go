package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
)

// TestMakespanFormulas: with every forward taking f and every backward b
// and nothing to send, a 1F1B step of m microbatches over p devices takes
// (m + p − 1)(f + b), and the interleaved schedule with v chunks a device
// (each f/v and b/v) m(f + b) + (p − 1)(f + b)/v: Narayanan et al. 2021,
// §2.2's bubbles.
func TestMakespanFormulas(t *testing.T) {
	const f, b = 3.0, 7.0
	for _, tt := range []struct{ p, m, v int }{
		{1, 1, 1}, {1, 5, 1}, {2, 4, 1}, {4, 8, 1}, {8, 64, 1}, {4, 2, 1}, {8, 3, 1},
		{2, 4, 2}, {4, 8, 2}, {4, 4, 3}, {8, 64, 2}, {8, 16, 4}, {3, 9, 3},
	} {
		pp := Pipeline{Stages: tt.p, Microbatches: tt.m, Virtual: tt.v, Schedule: "1f1b"}
		want := float64(tt.m+tt.p-1) * (f + b)
		if tt.v > 1 {
			pp.Schedule = "interleaved"
			want = float64(tt.m)*(f+b) + float64(tt.p-1)*(f+b)/float64(tt.v)
		}
		fwd, bwd := uniform(tt.p, tt.v, f/float64(tt.v)), uniform(tt.p, tt.v, b/float64(tt.v))
		got, err := pp.Makespan(fwd, bwd, make([]float64, tt.p*tt.v-1))
		if err != nil {
			t.Fatalf("%+v: %v", tt, err)
		}
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("p %d, m %d, v %d: makespan %g, want %g", tt.p, tt.m, tt.v, got, want)
		}
	}
}

func uniform(p, v int, x float64) [][]float64 {
	out := make([][]float64, p)
	for k := range out {
		out[k] = make([]float64, v)
		for c := range out[k] {
			out[k][c] = x
		}
	}
	return out
}

// TestMakespanLongestPath checks the replay against the longest path
// through the schedule's graph, computed by recursion over each op's two
// predecessors (the device's previous op, and the op whose output or
// gradient it receives, plus the send), on random times.
func TestMakespanLongestPath(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tt := range []struct{ p, m, v int }{{2, 3, 1}, {4, 8, 1}, {4, 2, 1}, {3, 7, 1}, {2, 4, 2}, {4, 8, 2}, {3, 6, 3}, {4, 4, 2}} {
		for trial := range 5 {
			pp := Pipeline{Stages: tt.p, Microbatches: tt.m, Virtual: tt.v, Schedule: "1f1b"}
			if tt.v > 1 {
				pp.Schedule = "interleaved"
			}
			random := func() [][]float64 {
				out := uniform(tt.p, tt.v, 0)
				for k := range out {
					for c := range out[k] {
						out[k][c] = 1 + 9*r.Float64()
					}
				}
				return out
			}
			fwd, bwd := random(), random()
			send := make([]float64, tt.p*tt.v-1)
			for g := range send {
				send[g] = 3 * r.Float64()
			}
			got, err := pp.Makespan(fwd, bwd, send)
			if err != nil {
				t.Fatal(err)
			}
			if want := longestPath(pp, fwd, bwd, send); math.Abs(got-want) > 1e-9*want {
				t.Errorf("p %d, m %d, v %d, trial %d: makespan %g, longest path %g", tt.p, tt.m, tt.v, trial, got, want)
			}
		}
	}
}

// longestPath is the finish of the schedule's last op, each op finishing
// its time after the later of its device's previous op and its input's
// arrival.
func longestPath(pp Pipeline, fwd, bwd [][]float64, send []float64) float64 {
	p, chunks := pp.Stages, pp.Stages*pp.Virtual
	type key struct {
		forward      bool
		chunk, micro int // model chunk
	}
	orders := make([][]PipeOp, p)
	index := map[key]int{} // position in its device's order
	for k := range orders {
		orders[k] = pp.Order(k)
		for i, op := range orders[k] {
			index[key{op.Forward, op.Chunk*p + k, op.Micro}] = i
		}
	}
	memo := map[key]float64{}
	var finish func(key) float64
	finish = func(o key) float64 {
		if t, ok := memo[o]; ok {
			return t
		}
		k, c := o.chunk%p, o.chunk/p
		start := 0.0
		if i := index[o]; i > 0 {
			prev := orders[k][i-1]
			start = finish(key{prev.Forward, prev.Chunk*p + k, prev.Micro})
		}
		took := fwd[k][c]
		switch {
		case o.forward && o.chunk > 0:
			start = max(start, finish(key{true, o.chunk - 1, o.micro})+send[o.chunk-1])
		case !o.forward:
			took = bwd[k][c]
			if o.chunk < chunks-1 {
				start = max(start, finish(key{false, o.chunk + 1, o.micro})+send[o.chunk])
			}
		}
		memo[o] = start + took
		return memo[o]
	}
	end := 0.0
	for k := range orders {
		last := orders[k][len(orders[k])-1]
		end = max(end, finish(key{last.Forward, last.Chunk*p + k, last.Micro}))
	}
	return end
}

// TestMakespanChecksItsInput: times of the wrong shape are an error.
func TestMakespanChecksItsInput(t *testing.T) {
	pp := Pipeline{Stages: 2, Microbatches: 2, Virtual: 1, Schedule: "1f1b"}
	for _, tt := range []struct {
		fwd, bwd [][]float64
		send     []float64
	}{
		{uniform(1, 1, 1), uniform(2, 1, 1), []float64{0}},
		{uniform(2, 1, 1), uniform(2, 2, 1), []float64{0}},
		{uniform(2, 1, 1), uniform(2, 1, 1), nil},
	} {
		if _, err := pp.Makespan(tt.fwd, tt.bwd, tt.send); err == nil {
			t.Errorf("%v %v %v: no error", tt.fwd, tt.bwd, tt.send)
		}
	}
}

func ExamplePipeline_Makespan() {
	// Four devices, eight microbatches, each forward 1 and backward 2:
	// (8 + 4 − 1)·3 = 33, of which 9 is the bubble.
	pp := Pipeline{Stages: 4, Microbatches: 8, Virtual: 1, Schedule: "1f1b"}
	fwd := [][]float64{{1}, {1}, {1}, {1}}
	bwd := [][]float64{{2}, {2}, {2}, {2}}
	t, err := pp.Makespan(fwd, bwd, []float64{0, 0, 0})
	fmt.Println(t, err)
	// Output: 33 <nil>
}

// TestPipelineStepTime prices a pipeline's step in time. One stage runs
// its m microbatches back to back: its step is the single-device plan's
// of m accumulated micro-batches, each storing everything (Plan.StepCost,
// which adds the optimizer step to m micro-batches). Over p stages the
// step lies between the slowest stage's own work and (m + p − 1) of its
// microbatches, each with the optimizer step added; it is neither the
// devices' sum nor their largest.
func TestPipelineStepTime(t *testing.T) {
	r := &costmodel.Roofline{MatrixFLOPS: 1e12, MatrixFP32FLOPS: 1e11, BandwidthBytes: 1e10, MatrixEfficiency: 1, BandwidthEfficiency: 1, LaunchSeconds: 1e-6}
	const m = 4
	for _, model := range []string{"tiny-llama", "tiny-gpt2"} {
		src, err := graphio.Load(model)
		if err != nil {
			t.Fatal(err)
		}
		src.Model.Training.GradAccum = m
		p, err := NewTimed(src, r)
		if err != nil {
			t.Fatal(err)
		}
		one, err := p.PlanPipeline(&Options{Budget: 1 << 40, Strategy: StoreAll}, Pipeline{Stages: 1, Microbatches: m})
		if err != nil {
			t.Fatal(err)
		}
		single, err := p.Plan(&Options{Budget: 1 << 40, Strategy: StoreAll})
		if err != nil {
			t.Fatal(err)
		}
		if _, want := single.StepCost(); one.BaselineCost != want || one.Cost != want {
			t.Errorf("%s on one stage: step %g ps, store-everything %g, want the plan's %g", model, one.Cost, one.BaselineCost, want)
		}
		if one.UpdateCost != single.UpdateCost || one.UpdateCost == 0 {
			t.Errorf("%s on one stage: optimizer step %g ps, want the plan's %g", model, one.UpdateCost, single.UpdateCost)
		}
		two, err := p.PlanPipeline(&Options{Budget: 1 << 40, Strategy: StoreAll}, Pipeline{Stages: 2, Microbatches: m})
		if err != nil {
			t.Fatal(err)
		}
		var sum, slowest float64
		for _, d := range two.Devices {
			sum += d.Cost
			slowest = max(slowest, d.Cost)
		}
		lo, hi := slowest+two.UpdateCost, slowest*(m+1)/m+two.UpdateCost
		if two.Cost <= lo || two.Cost > hi || two.Cost == sum || two.Cost != two.BaselineCost {
			t.Errorf("%s on two stages: step %g ps, want in (%g, %g], not the devices' sum %g, and store-everything's", model, two.Cost, lo, hi, sum)
		}
	}
}

// TestPipelineStepCollectives: a pipeline's data-parallel collectives.
// On one stage the step is the single-device plan's StepCost, whose
// collectives Plan.stepOf prices on its own (Comm.Exposed), for every
// ZeRO stage and DDP's no_sync, over a link slow enough that they show
// and one fast enough that backwards hide them. On two stages without
// ZeRO, whose optimizer step data parallelism leaves whole, the step less
// what the collectives add is the step of one replica.
func TestPipelineStepCollectives(t *testing.T) {
	const m = 4
	for _, link := range []float64{1e7, 1e12} {
		r := &costmodel.Roofline{MatrixFLOPS: 1e12, MatrixFP32FLOPS: 1e11, BandwidthBytes: 1e10, MatrixEfficiency: 1, BandwidthEfficiency: 1, LaunchSeconds: 1e-6,
			LinkBytes: link, LinkEfficiency: 1}
		for _, tc := range []struct {
			zero   int64
			noSync bool
		}{{0, false}, {0, true}, {1, false}, {2, false}, {3, false}} {
			name := fmt.Sprintf("link %g B/s, zero %d, no_sync %v", link, tc.zero, tc.noSync)
			problem := func(dp int64) *Problem {
				src, err := graphio.Load("tiny-llama")
				if err != nil {
					t.Fatal(err)
				}
				src.Model.Training.GradAccum = m
				par := &src.Model.Training.Parallel
				par.DP, par.Zero, par.NoSync = dp, tc.zero, tc.noSync
				p, err := NewTimed(src, r)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			p := problem(4)
			opt := &Options{Budget: 1 << 40, Strategy: StoreAll}
			one, err := p.PlanPipeline(opt, Pipeline{Stages: 1, Microbatches: m})
			if err != nil {
				t.Fatal(err)
			}
			single, err := p.Plan(opt)
			if err != nil {
				t.Fatal(err)
			}
			if single.Comm == nil {
				t.Fatalf("%s: the plan has no collectives", name)
			}
			if _, want := single.StepCost(); one.Cost != want || one.BaselineCost != want {
				t.Errorf("%s on one stage: step %g ps, store-everything %g, want the plan's %g", name, one.Cost, one.BaselineCost, want)
			}
			if one.CommCost != single.CommCost() || link > 1e9 && one.CommCost != single.Comm.AfterStep {
				t.Errorf("%s on one stage: collectives add %g ps, want the plan's %g (on a fast link, the gather after the step's %g)", name, one.CommCost, single.CommCost(), single.Comm.AfterStep)
			}
			if tc.zero != 0 {
				continue
			}
			two, err := p.PlanPipeline(opt, Pipeline{Stages: 2, Microbatches: m})
			if err != nil {
				t.Fatal(err)
			}
			alone, err := problem(1).PlanPipeline(opt, Pipeline{Stages: 2, Microbatches: m})
			if err != nil {
				t.Fatal(err)
			}
			if got := two.Cost - two.CommCost; got != alone.Cost || (two.CommCost > 0) != (link < 1e9) {
				t.Errorf("%s on two stages: step %g ps less collectives %g is %g, want one replica's %g", name, two.Cost, two.CommCost, got, alone.Cost)
			}
		}
	}
}

// TestPipelineTimesByHand: two devices, two microbatches, forwards of 1
// and backwards of 2. Alone the schedule ends at 9 on device 0 and 7 on
// device 1 ((m + p − 1)(f + b)). Reduced once a step, device 0's 5 follow
// its last backward less the 2 it hides (12), device 1's 1 hides; then
// the update of 0.5 and the larger all-gather after it, 3: 15.5. Reduced
// every microbatch, device 0's 4 leave 2 of each backward's 2 exposed:
// its backwards take 4, the second ending at 12; then the update: 12.5.
// A tied weight's all-reduce of 2 between the two devices starts once
// both are done: at 9 alone (11.5), at 12 after the reductions once a
// step (17.5).
func TestPipelineTimesByHand(t *testing.T) {
	for _, tc := range []struct {
		comm               []*Comm
		tied               float64
		step, comm0, tied0 float64
	}{
		{[]*Comm{nil, nil}, 0, 9.5, 0, 0},
		{[]*Comm{{Reduce: 5, OnceAStep: true, AfterStep: 1}, {Reduce: 1, OnceAStep: true, AfterStep: 3}}, 0, 15.5, 6, 0},
		{[]*Comm{{Reduce: 4}, nil}, 0, 12.5, 3, 0},
		{[]*Comm{nil, nil}, 2, 11.5, 0, 2},
		{[]*Comm{{Reduce: 5, OnceAStep: true, AfterStep: 1}, {Reduce: 1, OnceAStep: true, AfterStep: 3}}, 2, 17.5, 6, 2},
	} {
		pp := Pipeline{Stages: 2, Microbatches: 2, Virtual: 1}
		times := newPipelineTimes(pp)
		for k := range 2 {
			times.fwd[k][0], times.bwd[k][0], times.stored[k][0] = 1, 2, 2
			times.update[k] = 0.5
		}
		times.comm = tc.comm
		if tc.tied > 0 {
			times.tied = []tiedReduce{{a: 0, b: 1, time: tc.tied}}
		}
		cost, baseline, comm, tied, err := times.step()
		if err != nil {
			t.Fatal(err)
		}
		if cost != tc.step || baseline != tc.step || comm != tc.comm0 || tied != tc.tied0 {
			t.Errorf("collectives %+v, tied %g: step %g, store-everything %g, collectives %g, tied %g; want %g, %g, %g, %g", tc.comm, tc.tied, cost, baseline, comm, tied, tc.step, tc.step, tc.comm0, tc.tied0)
		}
	}
}

// TestTiedReduce prices the all-reduce of a tied weight's gradients
// between the pipeline devices holding its copies: tiny-gpt2 ties its
// head to the embedding (vocabulary 512 × hidden 64 fp32 gradients,
// 131,072 bytes, 2(n−1)/n of them through each of 2 ranks' links), on a
// link of 1 MB/s: 131.072 ms after both devices' backwards; so
// tiny-llama tied (the same sizes), interleaved, its embedding in device
// 0's first chunk and its head in device 1's last. On one device, or
// untied, there is none.
func TestTiedReduce(t *testing.T) {
	r := &costmodel.Roofline{MatrixFLOPS: 1e12, MatrixFP32FLOPS: 1e11, BandwidthBytes: 1e10, MatrixEfficiency: 1, BandwidthEfficiency: 1, LaunchSeconds: 1e-6,
		LinkBytes: 1e6, LinkEfficiency: 1}
	for _, tc := range []struct {
		model string
		tied  bool
		pp    Pipeline
		bytes float64 // the gradients all-reduced, 0 for none
	}{
		{"tiny-gpt2", true, Pipeline{Stages: 2, Microbatches: 2, Virtual: 1}, 512 * 64 * 4},
		{"tiny-llama", true, Pipeline{Stages: 2, Microbatches: 4, Virtual: 2, Schedule: "interleaved"}, 512 * 64 * 4},
		{"tiny-gpt2", true, Pipeline{Stages: 1, Microbatches: 2, Virtual: 1}, 0},
		{"tiny-llama", false, Pipeline{Stages: 2, Microbatches: 2, Virtual: 1}, 0},
	} {
		src, err := graphio.Load(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		src.Model.TiedEmbeddings = tc.tied
		p, err := NewTimed(src, r)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := p.PlanPipeline(&Options{Budget: 1 << 40, Strategy: StoreAll}, tc.pp)
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.bytes / 1e6 * 1e12; plan.TiedCost != want {
			t.Errorf("%s over %+v: the tied all-reduce adds %g ps, want %g", tc.model, tc.pp, plan.TiedCost, want)
		}
	}
}
