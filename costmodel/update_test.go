package costmodel

import (
	"math"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// TestUpdateOf counts tiny-llama's optimizer steps by hand. It trains
// T = 262,720 parameters in 39 tensors: the embedding (512·64), four
// layers of q and o (64·64), k and v (64·32), gate, up and down (64·192)
// and two norms (64), the final norm and the head (512·64). Every tensor
// has an even size, so two ZeRO ranks hold half each.
func TestUpdateOf(t *testing.T) {
	const T, tensors = 262720, 39
	for _, tc := range []struct {
		name    string
		set     func(*ir.Setup)
		bytes   int64
		kernels int64
	}{
		// weight 2 passes, gradient 1, moments 4, fp32
		{"fused", func(s *ir.Setup) { s.Optimizer = ir.OptimizerAdamWFused }, T * (2*4 + 4 + 4*4), 1},
		// weight 4, gradient 3, moments and temporary 14
		{"foreach", func(s *ir.Setup) { s.Optimizer = ir.OptimizerAdamW }, T * (4*4 + 3*4 + 14*4), 10},
		{"for-loop", func(s *ir.Setup) { s.Optimizer = ir.OptimizerAdamWForLoop }, T * (4*4 + 3*4 + 14*4), 10 * tensors},
		{"sgd", func(s *ir.Setup) { s.Optimizer = ir.OptimizerSGD }, T * (2*4 + 4), 1},
		// byte-wide moments, a kernel a tensor
		{"8-bit", func(s *ir.Setup) { s.Optimizer = ir.OptimizerAdamW8bit }, T * (2*4 + 4 + 4*1), tensors},
		{"paged", func(s *ir.Setup) { s.Optimizer = ir.OptimizerPagedAdamW }, T * (2*4 + 4 + 4*4), tensors},
		{"none", func(s *ir.Setup) { s.Optimizer = ir.OptimizerNone }, 0, 0},
		{"zero-1", func(s *ir.Setup) {
			s.Optimizer = ir.OptimizerAdamWFused
			s.Parallel.DP, s.Parallel.Zero = 2, 1
		}, T / 2 * (2*4 + 4 + 4*4), 1},
		// bf16 weights and gradients; an fp32 master updated, then cast
		// into the weight (4 + 2 bytes)
		{"bf16 master", func(s *ir.Setup) {
			s.Optimizer, s.DType = ir.OptimizerAdamWFused, "bf16"
		}, T * (2*4 + 2 + 4*4 + 4 + 2), 1},
		// bf16 moments, no master
		{"bf16 own dtype", func(s *ir.Setup) {
			s.Optimizer, s.DType, s.MasterWeights = ir.OptimizerAdamWFused, "bf16", ir.MasterNone
		}, T * (2*2 + 2 + 4*2), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := graphio.Load("tiny-llama")
			if err != nil {
				t.Fatal(err)
			}
			tc.set(&src.Model.Training)
			g, err := graphio.Build(src.Model)
			if err != nil {
				t.Fatal(err)
			}
			u := UpdateOf(g)
			if u.Bytes != tc.bytes || u.Kernels != tc.kernels {
				t.Errorf("UpdateOf = %d bytes, %d kernels; want %d, %d", u.Bytes, u.Kernels, tc.bytes, tc.kernels)
			}
		})
	}
}

// TestUpdateSeconds prices an update: its traffic over the bandwidth, at
// least its launches on a GPU, and the two added on a CPU.
func TestUpdateSeconds(t *testing.T) {
	r := Roofline{BandwidthBytes: 1e9, BandwidthEfficiency: 0.5, LaunchSeconds: 1e-3}
	for _, tc := range []struct {
		u    Update
		sync bool
		want float64
	}{
		{Update{Bytes: 1e6, Kernels: 1}, false, 2e-3},
		{Update{Bytes: 1e6, Kernels: 3}, false, 3e-3},
		{Update{Bytes: 1e6, Kernels: 3}, true, 5e-3},
		{Update{}, true, 0},
	} {
		r.Synchronous = tc.sync
		if got := r.Seconds(tc.u); got != tc.want {
			t.Errorf("Seconds(%+v), synchronous %v = %g, want %g", tc.u, tc.sync, got, tc.want)
		}
	}
}

// TestCollectivesOf counts tiny-llama's collectives over 4 ranks by hand:
// its T trained fp32 parameters are 4T bytes of weights and as many of
// gradients, of which an all-gather or reduce-scatter moves 3/4 through
// each rank's link and an all-reduce twice that. Under the megatron
// profile in bf16 the gradients are Megatron-LM's fp32 buffer, 4T, and
// the weights 2T: reduced once a step after the backward (all-reduced;
// reduce-scattered by the distributed optimizer, which all-gathers the
// updated weights after the step).
func TestCollectivesOf(t *testing.T) {
	const T = 262720
	const once = 4 * T * 3 / 4
	const half = 2 * T * 3 / 4
	megatron := func(c Collectives) Collectives { c.OnceAStep, c.AfterBackward = true, true; return c }
	for _, tc := range []struct {
		dp, zero int64
		noSync   bool
		megatron bool
		want     Collectives
	}{
		{1, 0, false, false, Collectives{}},
		{4, 0, false, false, Collectives{Reduce: 2 * once}},
		{4, 0, true, false, Collectives{Reduce: 2 * once, OnceAStep: true}},
		{4, 1, false, false, Collectives{Reduce: 2 * once, AfterStep: once, OnceAStep: true}},
		{4, 2, false, false, Collectives{Reduce: once, AfterStep: once}},
		{4, 3, false, false, Collectives{Gather: 2 * once, Reduce: once}},
		{1, 0, false, true, Collectives{}},
		{4, 0, false, true, megatron(Collectives{Reduce: 2 * once})},
		{4, 1, false, true, megatron(Collectives{Reduce: once, AfterStep: half})},
	} {
		src, err := graphio.Load("tiny-llama")
		if err != nil {
			t.Fatal(err)
		}
		if tc.megatron {
			src.Model.Training.Profile, src.Model.Training.DType = ir.ProfileMegatron, "bf16"
		}
		p := &src.Model.Training.Parallel
		p.DP, p.Zero, p.NoSync = tc.dp, tc.zero, tc.noSync
		g, err := graphio.Build(src.Model)
		if err != nil {
			t.Fatal(err)
		}
		if got := CollectivesOf(g); got != tc.want {
			t.Errorf("dp %d, zero %d, no_sync %v, megatron %v: %+v, want %+v", tc.dp, tc.zero, tc.noSync, tc.megatron, got, tc.want)
		}
	}
}

// TestCollectivesOfNodes counts by hand what each device of a two-stage
// pipeline of tiny-llama reduces over 4 data-parallel ranks under ZeRO 1:
// the first holds the embedding (512·64) and layers 0 and 1 (49,280
// parameters each), the second layers 2 and 3, the final norm (64) and
// the head (512·64), or, tied, its copy of the embedding.
func TestCollectivesOfNodes(t *testing.T) {
	const first, second = 32768 + 2*49280, 2*49280 + 64 + 32768
	once := func(n int64) int64 { return 4 * n * 3 / 4 }
	for _, tied := range []bool{false, true} {
		src, err := graphio.Load("tiny-llama")
		if err != nil {
			t.Fatal(err)
		}
		src.Model.TiedEmbeddings = tied
		p := &src.Model.Training.Parallel
		p.DP, p.Zero = 4, 1
		g, err := graphio.Build(src.Model)
		if err != nil {
			t.Fatal(err)
		}
		var a, b []int
		for i, n := range g.Nodes {
			if strings.HasPrefix(n.Name, "embed") || strings.HasPrefix(n.Name, "layers.0.") || strings.HasPrefix(n.Name, "layers.1.") {
				a = append(a, i)
			} else {
				b = append(b, i)
			}
		}
		for _, tc := range []struct {
			nodes  []int
			params int64
		}{{a, first}, {b, second}} {
			want := Collectives{Reduce: 2 * once(tc.params), AfterStep: once(tc.params), OnceAStep: true}
			got, err := CollectivesOfNodes(g, tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("tied %v, %d parameters: %+v, want %+v", tied, tc.params, got, want)
			}
		}
		if _, err := CollectivesOfNodes(g, []int{len(g.Nodes)}); err == nil {
			t.Errorf("a node out of range: no error")
		}
	}
}

// TestTensorParallelTime prices tiny-llama's all-reduces over two
// tensor-parallel ranks: each moves its tensor (2·32·64 fp32, 16 KiB)
// through the link, 2(n−1)/n of it. The forward reduces the embedding's
// output and every layer's output and down projections (9); the backward
// the gradients of every layer's two normalized inputs and the head's
// (9).
func TestTensorParallelTime(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Parallel.TP = 2
	c := analyzeModel(t, src.Model)
	r := Roofline{MatrixFLOPS: 1e12, MatrixFP32FLOPS: 1e11, BandwidthBytes: 1e10, MatrixEfficiency: 1, BandwidthEfficiency: 1, LaunchSeconds: 1e-6}
	without, err := c.Times(r)
	if err != nil {
		t.Fatal(err)
	}
	r.LinkBytes, r.LinkEfficiency = 1e9, 1
	with, err := c.Times(r)
	if err != nil {
		t.Fatal(err)
	}
	const each = 16384 * 1e12 / 1e9 // ps
	var fwd, bwd, nodes float64
	for i := range with {
		fwd += float64(with[i].Forward - without[i].Forward)
		bwd += float64(with[i].Backward - without[i].Backward)
		nodes++
	}
	for _, x := range []struct {
		name      string
		got, want float64
	}{{"forward", fwd, 9 * each}, {"backward", bwd, 9 * each}} {
		if math.Abs(x.got-x.want) > nodes { // a picosecond of rounding a node
			t.Errorf("%s: the all-reduces add %g ps, want %g", x.name, x.got, x.want)
		}
	}
}
