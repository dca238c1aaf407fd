package costmodel

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/google/go-cmp/cmp"
)

// TestStaticZeRO checks static memory against the ZeRO paper's accounting
// (Rajbhandari et al. 2020, Figure 1): with mixed precision and Adam,
// (2 + 2 + K)Ψ bytes with K = 12; stage 1 divides KΨ by Nd, stage 2 also
// the gradients, stage 3 everything, and gathers what it runs.
func TestStaticZeRO(t *testing.T) {
	build := func(dtype string, zero, dp int64, opt string) Static {
		m := &graphio.Model{Name: "s", Family: "llama", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 100, Training: ir.DefaultSetup()}
		m.Training.DType, m.Training.Optimizer = dtype, ir.Optimizer(opt)
		if o, ok := strings.CutSuffix(opt, " own-dtype"); ok {
			m.Training.Optimizer, m.Training.MasterWeights = ir.Optimizer(o), ir.MasterNone
		}
		m.Training.Parallel = ir.Parallel{DP: dp, TP: 1, Zero: zero}
		c := analyzeModel(t, m)
		// The rotary tables: cos and sin, seq × head size each; and the
		// rotary module's inverse frequencies, head size / 2 in fp32.
		if want := 2*m.Training.Seq*16*c.Graph.DType.Size() + 16/2*4; c.Static.Of(Buffers) != want {
			t.Errorf("buffers = %d, want %d", c.Static.Of(Buffers), want)
		}
		st := c.Static
		st.add(Buffers, -st.Of(Buffers))
		// The step no longer holds the tables the forward made.
		st.StepFreedBytes -= 2 * m.Training.Seq * 16 * c.Graph.DType.Size()
		return st
	}
	psi := build("bf16", 0, 1, "adamw").Parameters
	// 100·64 embedding + 100·64 head + 2 layers of (64·64·2 + 64·32·2 + 3·64·128 + 2·64) + 64.
	if want := int64(100*64*2 + 2*(64*64*2+64*32*2+3*64*128+2*64) + 64); psi != want {
		t.Fatalf("parameters = %d, want %d", psi, want)
	}
	const root = 100*64*2 + 64
	const layer = 64*64*2 + 64*32*2 + 3*64*128 + 2*64
	tests := []struct {
		name  string
		dtype string
		zero  int64
		opt   string
		want  Static
	}{
		{"bf16 adamw", "bf16", 0, "adamw", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi, OptimizerBytes: 12 * psi, StepBytes: 4 * psi}},
		{"fp32 adamw", "fp32", 0, "adamw", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 4 * psi, GradientsBytes: 4 * psi, OptimizerBytes: 8 * psi, StepBytes: 4 * psi}},
		{"bf16 sgd", "bf16", 0, "sgd", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi, OptimizerBytes: 4 * psi}},
		// PyTorch's AdamW over bf16 weights keeps bf16 moments and no
		// master copy, and its foreach step a bf16 square root of each.
		{"bf16 adamw, moments in bf16", "bf16", 0, "adamw own-dtype", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi, OptimizerBytes: 4 * psi, StepBytes: 2 * psi}},
		{"fp32 none", "fp32", 0, "none", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 4 * psi, GradientsBytes: 4 * psi}},
		// The foreach step takes the square root of every fp32 second
		// moment at once; the fused step makes nothing, the for-loop one
		// the square root and quotient of the largest tensor, an MLP's
		// 64·128 projection, while the denominator of the one before it,
		// another, is still bound. The fused step keeps its step counters on
		// the device, a 0-dim fp32 tensor for each of the 21 trained
		// tensors (embedding, head, final norm, 9 a layer); the others on
		// the host.
		{"fp32 adamw-fused", "fp32", 0, "adamw-fused", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 4 * psi, GradientsBytes: 4 * psi, OptimizerBytes: 8 * psi, Terms: []Held{{"counters", 4 * 21}}}},
		{"bf16 adamw-forloop", "bf16", 0, "adamw-forloop", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi, OptimizerBytes: 12 * psi, StepBytes: 3 * 4 * 64 * 128}},
		// Stages 1 and 2, as DeepSpeed runs them, reduce through a bucket
		// of the largest layer's 36,992 gradients (73,984 B) into the
		// rank's partition of the gradients: a share of the 86,848
		// parameters padded to twice the 4 ranks, 21,712, and at each
		// boundary inside a block (the shares end at 21,712, in layers.0,
		// and 43,424 and 65,136, in layers.1) up to the block's largest
		// parameter (8,192) but one element, which crosses it whole: the
		// second rank's, 21,712 + 2·8,191 = 38,094 elements, 76,188 B
		// (more than with the norms in a parameter group of their own:
		// 21,632 + 8,191 and 80 + 2·63). Stage 1 reduces once the
		// backward has run, holding at most the partition and a bucket's
		// flattened copy (150,172 B). Stage 2's hooks reduce in the
		// backward, in its order (head 6,400 + 64; each layer down, up,
		// gate 8,192, a norm 64, o 4,096, v and k 2,048, q 4,096, a norm
		// 64; the embedding 6,400), beside the bucket and the partition:
		// the head's hold its 12,800-byte gradient; layers.1's v
		// overflows the bucket at 35,200 elements, a copy of 70,400 B
		// beside its 4,096; layers.0's v at 36,992: 73,984 + 4,096; the
		// embedding's its 12,800; the backward's end reduces the last
		// 14,656 elements, 29,312 B.
		//
		// Their step, as DeepSpeed runs it, holds neither: the backward's
		// end frees the bucket and stage 1's whole gradients, and the step
		// turns the rank's bf16 partition (2Ψ/4, in a buffer of 76,188 B
		// with its crossing parameters) into an fp32 one (4Ψ/4), through a
		// flat bf16 copy, before the foreach update's square root of the
		// fp32 partition (4Ψ/4): the larger of 76,188 + 2Ψ/4 + 4Ψ/4 and
		// 4Ψ/4 + 4Ψ/4.
		{"zero 1", "bf16", 1, "adamw", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi, OptimizerBytes: 12 * psi / 4,
			Buckets:     &DeepSpeedBuckets{Stage: 1, Bucket: 2 * layer, Partition: 76188, Hooks: map[string]int64{}, End: 2*layer + 76188},
			LayerParams: layer, LayerTrainable: layer, StepBytes: 76188 + 2*psi/4 + 4*psi/4, StepFreedBytes: 2 * psi}},
		{"zero 2", "bf16", 2, "adamw", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi, GradientsBytes: 2 * psi / 4, OptimizerBytes: 12 * psi / 4,
			Buckets: &DeepSpeedBuckets{Stage: 2, Bucket: 2 * layer, Partition: 76188, Hooks: map[string]int64{
				"head": 12800, "layers.1": 74496, "layers.0": 78080, "embed": 12800}, End: 29312},
			LayerParams: layer, LayerTrainable: layer, StepBytes: 76188 + 2*psi/4 + 4*psi/4, StepFreedBytes: 2 * psi / 4}},
		// Stage 3 gathers too (TestFSDPGathers): the forward and backward
		// hold the root (embedding, head, final norm) unsharded and a
		// layer's all-gather output; the step none of it. FSDP2 makes the
		// root's shard of the gradients when the backward ends.
		{"zero 3", "bf16", 3, "adamw", Static{Parameters: psi, TrainableParameters: psi, WeightsBytes: 2 * psi / 4, GradientsBytes: 2 * psi / 4, OptimizerBytes: 12 * psi / 4,
			Terms: []Held{{"gathered", 2*root + 2*layer}}, Gather: Gather{RootWeights: 2 * root, RootGrads: 2 * root, LayerWeights: 2 * layer, LayerGrads: 2 * layer, RootShard: 2 * root / 4, FSDP2: true},
			LayerParams: layer, LayerTrainable: layer, StepBytes: 4 * psi / 4, StepFreedBytes: 2*root + 2*layer}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dp := int64(1)
			if tt.zero > 0 {
				dp = 4
			}
			if diff := cmp.Diff(tt.want, build(tt.dtype, tt.zero, dp, tt.opt)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestFSDPGathers counts what ZeRO stage 3 gathers as FSDP2 runs it
// (Gather): Llama 3 8B in bf16 over 8 ranks, a layer of 4096² (q, o),
// 4096·1024 (k, v), 3·4096·14336 (the MLP) and two norms of 4096 weights,
// W bytes; the root's untied embedding and head of 128256·4096 and the
// final norm, R. The forward and backward hold the root unsharded and one
// all-gather output, a layer's whole weights (every rank's shard). A
// layer's forward adds its weights, W, and the first's, at its start, the
// root's output buffer, R. A layer's backward adds its weights and the
// buffer it prefetched (the first layer none) and the reduce-scatter
// input of the layer after it (the last none), and at its start its own
// buffer instead of the prefetched one. The root's gather adds its buffer
// beside its weights, less the layer's buffer counted already. The root's
// shard of its gradients FSDP2 makes when the backward ends. Under
// DeepSpeed's stage 3 every layer is bounded by 3W + W forward and 3W +
// 2W backward, and the root's gather by its temporary too.
func TestFSDPGathers(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	m := src.Model
	m.Training.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: 3}
	const layer = 2 * (2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096)
	const root = 2 * (2*128256*4096 + 4096)
	c := analyzeModel(t, m)
	st := c.Static
	want := Gather{RootWeights: root, RootGrads: root, LayerWeights: layer, LayerGrads: layer, RootShard: root / 8, FSDP2: true}
	// A layer's node makes its unsharded gradient and keeps its shard:
	// the shards of a layer are an eighth of its gradients.
	var keep, unsharded int64
	for i, n := range c.Graph.Nodes {
		if n.Block == "layers.0" {
			pg := c.ParamGrads[i]
			if pg.Keep*8 < pg.Keep+pg.Unsharded || (pg.Keep-1)*8 >= pg.Keep+pg.Unsharded {
				t.Errorf("%s: keeps %d of %d unsharded, want an eighth", n.Name, pg.Keep, pg.Keep+pg.Unsharded)
			}
			keep, unsharded = keep+pg.Keep, unsharded+pg.Unsharded
		}
	}
	if keep+unsharded != layer || keep != layer/8 {
		t.Errorf("layers.0 keeps %d of its gradients' %d, want %d of %d", keep, keep+unsharded, layer/8, layer)
	}
	if diff := cmp.Diff(want, st.Gather); diff != "" {
		t.Errorf("llama-3-8b, ZeRO 3 over 8 (-want +got)\n%s", diff)
	}
	if got, want := st.Of(Gathered), int64(root+layer); got != want {
		t.Errorf("gathered %d, want %d", got, want)
	}
	for _, tc := range []struct {
		name        string
		first, last bool
		want        LayerGather
	}{
		{"first", true, false, LayerGather{Forward: layer, ForwardStart: root, Backward: layer, BackwardStart: 2 * layer}},
		{"middle", false, false, LayerGather{Forward: layer, Backward: 2 * layer, BackwardStart: 2 * layer}},
		{"last", false, true, LayerGather{Forward: layer, Backward: layer, BackwardStart: layer}},
		{"only", true, true, LayerGather{Forward: layer, ForwardStart: root, BackwardStart: layer}},
	} {
		if diff := cmp.Diff(tc.want, st.Gather.Layer(tc.first, tc.last)); diff != "" {
			t.Errorf("the %s layer (-want +got)\n%s", tc.name, diff)
		}
	}
	if got, want := st.Gather.StartBytes(), int64(root-layer); got != want {
		t.Errorf("the root's gather %d, want %d", got, want)
	}
	// Under LoRA only the adapters have gradients (rank 16 on q and v):
	// the reduce-scatter input is theirs.
	m.Training.LoRA = ir.LoRA{Rank: 16, Targets: []ir.LoRATarget{"q", "v"}}
	adapters := int64(2 * 16 * (4096 + 4096 + 4096 + 1024))
	st = analyzeModel(t, m).Static
	want = Gather{RootWeights: root, LayerWeights: layer + adapters, LayerGrads: adapters, FSDP2: true}
	if diff := cmp.Diff(want, st.Gather); diff != "" {
		t.Errorf("llama-3-8b LoRA, ZeRO 3 over 8 (-want +got)\n%s", diff)
	}
	if got, want := st.Gather.Layer(false, false).Backward, layer+adapters+adapters; got != want {
		t.Errorf("a LoRA layer's backward gathers %d, want %d", got, want)
	}
	// Over two micro-batches FSDP2 reduce-scatters every backward into the
	// shards the step holds: a layer's unsharded gradients are held to its
	// reduce-scatter, and none kept.
	m.Training.LoRA = ir.LoRA{}
	m.Training.GradAccum = 2
	c = analyzeModel(t, m)
	if !c.Static.Gather.FSDP2 || c.Static.Gather.RootShard != 0 {
		t.Errorf("two micro-batches: FSDP2's moments %v, the root's shard %d; want them, and the shard held whole", c.Static.Gather.FSDP2, c.Static.Gather.RootShard)
	}
	keep, unsharded = 0, 0
	for i, n := range c.Graph.Nodes {
		if n.Block == "layers.0" {
			keep, unsharded = keep+c.ParamGrads[i].Keep, unsharded+c.ParamGrads[i].Unsharded
		}
	}
	if keep != 0 || unsharded != layer {
		t.Errorf("two micro-batches: layers.0 keeps %d and holds %d unsharded, want 0 and %d", keep, unsharded, layer)
	}
	m.Training.GradAccum = 1
	// DeepSpeed's stage 3 gathers module by module
	// (TestDeepSpeedPrefetch); where ckptplan does not know the modules
	// (LoRA's adapters), bounds.
	m.Training.Parallel.Sharding = ir.ShardingDeepSpeed
	st = analyzeModel(t, m).Static
	if st.Gather.FSDP2 || st.Gather.DeepSpeed == nil || st.Of(Gathered) != 0 || st.Gather.StartBytes() != 0 {
		t.Errorf("deepspeed: FSDP2's moments %v, module by module %v, gathered all along %d, at the start %d; want none but the modules",
			st.Gather.FSDP2, st.Gather.DeepSpeed != nil, st.Of(Gathered), st.Gather.StartBytes())
	}
	m.Training.LoRA = ir.LoRA{Rank: 16, Targets: []ir.LoRATarget{"q", "v"}}
	st = analyzeModel(t, m).Static
	if st.Gather.FSDP2 || st.Gather.DeepSpeed != nil {
		t.Errorf("deepspeed lora: FSDP2's moments %v, module by module %v; want bounds", st.Gather.FSDP2, st.Gather.DeepSpeed != nil)
	}
	w := layer + adapters
	if got, want := st.Gather.Layer(false, false), (LayerGather{Forward: 3*w + adapters, Backward: 3*w + 2*adapters}); got != want {
		t.Errorf("deepspeed lora: a layer gathers %+v, want %+v", got, want)
	}
	if got, want := st.Gather.StartBytes(), int64(2*root-w); got != want {
		t.Errorf("deepspeed lora: the root's gather %d, want %d", got, want)
	}
}

// TestZeROReduceSet: Llama 3 8B in bf16 over 8 ranks, its layer and root
// counted from its shapes, two micro-batches a step, where DeepSpeed's
// buffers are bounded instead of counted one by one (TestStaticZeRO).
// Stage 1 holds a layer's bucket and its copy and the rank's shard of the
// gradients (2Ψ/8); stage 2 the bucket, its copy and the root's gradients
// (its embedding and head, each larger than a layer). Under the megatron
// profile Megatron-LM's gradient buffer is the bucket: nothing more.
func TestZeROReduceSet(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	const layer = 2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096
	const root = 2*128256*4096 + 4096
	const psi = 32*layer + root
	for _, tt := range []struct {
		zero    int64
		profile ir.Profile
		want    int64
	}{
		{1, "transformers", 2*2*layer + 2*psi/8},
		{2, "transformers", 2*2*layer + 2*root},
		{1, "megatron", 0},
		{3, "transformers", 0}, // gathered_bytes counts stage 3's
	} {
		m := *src.Model
		m.Training.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: tt.zero}
		m.Training.Profile, m.Training.GradAccum = tt.profile, 2
		if got := analyzeModel(t, &m).Static.Of(Reduce); got != tt.want {
			t.Errorf("ZeRO %d, profile %q: reduce %d, want %d", tt.zero, tt.profile, got, tt.want)
		}
	}
}

// TestStaticNoSync: gradients reduced once a step, after the last
// microbatch (FSDP2's set_requires_gradient_sync(False), DDP's no_sync),
// are the whole model's on every rank, 2Ψ in bf16 (Rajbhandari et al.
// 2020's Ψ accounting), under ZeRO 2 and 3 as under 0 and 1; the
// optimizer state and ZeRO 3's weights stay sharded.
func TestStaticNoSync(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	for _, zero := range []int64{0, 1, 2, 3} {
		m := *src.Model
		m.Training.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: zero}
		synced := analyzeModel(t, &m).Static
		m.Training.Parallel.NoSync = true
		st := analyzeModel(t, &m).Static
		psi := st.Parameters
		if st.GradientsBytes != 2*psi {
			t.Errorf("ZeRO %d, no sync: gradients %d, want 2Ψ = %d", zero, st.GradientsBytes, 2*psi)
		}
		want := synced
		want.GradientsBytes = 2 * psi
		// DeepSpeed's step (deepSpeedStep) is for ZeRO 1 and 2 reducing
		// every backward; reduced once, the shards are updated by
		// PyTorch's foreach AdamW: a square root of each fp32 second
		// moment's shard.
		// The reduce buffers are freed when the backward ends, all the
		// same.
		if zero == 1 || zero == 2 {
			want.StepBytes, want.StepFreedBytes = 4*psi/8, st.Of(Buffers)-64*4+st.Of(Reduce) // all but the registered inverse frequencies
		}
		// The shards are held whole, not made in the backward, and a
		// layer's gathers are bounded, and so are DeepSpeed's buckets.
		want.Gather.RootShard, want.Gather.FSDP2 = 0, false
		want.Buckets = nil
		want.add(Reduce, st.Of(Reduce))

		if diff := cmp.Diff(want, st); diff != "" {
			t.Errorf("ZeRO %d, no sync, all but gradients (-want +got)\n%s", zero, diff)
		}
	}
}

func TestStaticLoRA(t *testing.T) {
	m := &graphio.Model{Name: "s", Family: "llama", Layers: 3, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 100, Training: ir.DefaultSetup()}
	m.Training.LoRA = ir.LoRA{Rank: 8, Targets: []ir.LoRATarget{"q", "v"}}
	c := analyzeModel(t, m)
	// q: 8·(64+64), v: 8·(64+32), per layer.
	adapters := int64(3 * (8*(64+64) + 8*(64+32)))
	if c.Static.TrainableParameters != adapters {
		t.Errorf("trainable = %d, want %d", c.Static.TrainableParameters, adapters)
	}
	want := Static{Parameters: c.Static.Parameters, TrainableParameters: adapters, WeightsBytes: 2 * c.Static.Parameters, GradientsBytes: 2 * adapters, OptimizerBytes: 12 * adapters, Terms: []Held{{"buffers", 2*2048*16*2 + 16/2*4}}, StepBytes: 4 * adapters, StepFreedBytes: 2 * 2048 * 16 * 2}
	if diff := cmp.Diff(want, c.Static); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

// TestStaticQLoRA counts QLoRA's static memory for Llama 3 8B by the
// published formulas: the decoder layers' linear weights in NF4, two to a
// byte, each block of 64 with an absolute maximum that double
// quantization stores as a byte, in blocks of 256 with an fp32 maximum
// and one fp32 offset a weight (Dettmers et al. 2023, §3: 0.127 bits a
// parameter for the constants), and each weight's copies of the NF4 map
// (16 fp32) and the maxima's 8-bit map (256 fp32), as bitsandbytes 0.48
// keeps them; embeddings, head and norms in bf16;
// rank-16 adapters on every linear in fp32 with fp32 gradients;
// bitsandbytes' paged 8-bit AdamW, two moments a byte each with an fp32
// maximum a block of 256 (Dettmers et al. 2022), and its two 256-value
// maps once, the moments of tensors of 10^5 elements or more in unified
// memory (get_state_buffer: here the adapters f × r); and the largest weight
// dequantized to bf16 while it runs.
func TestStaticQLoRA(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	m := src.Model
	m.Training.LoRA = ir.LoRA{Rank: 16, Targets: []ir.LoRATarget{"q", "k", "v", "o", "gate", "up", "down"}, FP32: true}
	m.Training.Quant, m.Training.DoubleQuant, m.Training.Optimizer = "nf4", true, "paged-adamw8bit"
	c := analyzeModel(t, m)
	const h, kv, f, v, l, r = 4096, 1024, 14336, 128256, 32, 16
	ceil := func(a, b int64) int64 { return (a + b - 1) / b }
	nf4 := func(in, out int64) int64 {
		n := in * out
		return n/2 + n/64 + 4*ceil(n/64, 256) + 4 + 4*16 + 4*256
	}
	linears := [][2]int64{{h, h}, {h, kv}, {h, kv}, {h, h}, {h, f}, {h, f}, {f, h}}
	var base, adapters, moments, paged int64
	for _, w := range linears {
		base += nf4(w[0], w[1])
		adapters += r * (w[0] + w[1])
		for _, n := range []int64{r * w[0], w[1] * r} {
			moments += 2 * (n + 4*ceil(n, 256))
			if n >= 100_000 { // bitsandbytes pages these moments: f × r, the MLP's
				paged += 2 * n
			}
		}
	}
	want := Static{
		Parameters: c.Static.Parameters, TrainableParameters: l * adapters,
		WeightsBytes:   l*base + 2*(2*v*h+2*h*l+h) + 4*l*adapters,
		GradientsBytes: 4 * l * adapters,
		OptimizerBytes: l*moments + 2*4*256,
		Terms:          []Held{{"dequant", 2 * h * f}, {"buffers", c.Static.Of(Buffers)}},
		Paged:          true, PagedBytes: l * paged, PagedTensorBytes: 2 * f * r,
		// The forward's int64 positions, which the layers' calls take.
		CallArgs: 8 * 8192,
		// The rotary tables the forward makes, cos and sin of 8192 × 128.
		StepFreedBytes: 2 * 8192 * 128 * 2,
	}
	if diff := cmp.Diff(want, c.Static); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

// TestQuantConstants checks the bits a parameter the quantization
// constants take: QLoRA's 0.5 (an fp32 maximum a block of 64) and, with
// double quantization, 8/64 + 32/(64·256) = 0.127 (Dettmers et al. 2023,
// §3); LLM.int8()'s fp32 scale a row.
func TestQuantConstants(t *testing.T) {
	const n, rows = 4096 * 4096, 4096
	for _, tt := range []struct {
		quant  ir.Quant
		double bool
		bits   float64
	}{{"nf4", false, 0.5}, {"nf4", true, 0.127}, {"fp4", true, 0.127}, {"int8", false, 32.0 / 4096}} {
		payload := int64(n / 2)
		if tt.quant == "int8" {
			payload = n
		}
		maps := int64(0)
		switch {
		case tt.quant == "int8":
		case tt.double:
			maps = 4 * (16 + 256)
		default:
			maps = 4 * 16
		}
		got := float64(quantBytes(quantWeight{n, rows}, tt.quant, tt.double)-payload-maps) * 8 / n
		if d := got - tt.bits; d > 0.0005 || d < -0.0005 {
			t.Errorf("%s double %v: constants %.4f bits a parameter, want %.3f", tt.quant, tt.double, got, tt.bits)
		}
	}
}

// TestOptimizersKnown checks that every optimizer a setup may name has
// its accounting.
func TestOptimizersKnown(t *testing.T) {
	for _, name := range ir.Optimizers() {
		if _, ok := optimizers[name]; !ok {
			t.Errorf("optimizer %q has no accounting", name)
		}
	}
}

// TestInt8KeepsInput checks that a linear whose weight is in int8 keeps
// its input for the backward, as bitsandbytes' 8-bit product does (its
// ctx.tensors on CUDA, ctx.A on the CPU), where a 4-bit one keeps only the
// weight: with adapters on q and v, an int8 Llama layer keeps, beyond the
// nf4 one's, the inputs of o_proj (b·s·h), of gate and up (the second
// norm's output, b·s·h) and of down_proj (b·s·f).
func TestInt8KeepsInput(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	saved := func(quant ir.Quant) int64 {
		m := *src.Model
		m.Training.LoRA = ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "v"}}
		m.Training.Quant = quant
		c := analyzeModel(t, &m)
		for _, b := range c.Blocks {
			if b.Name == "layers.0" {
				return b.SavedBytes
			}
		}
		t.Fatal("no layers.0")
		return 0
	}
	m := src.Model
	b, s, h, f := int64(m.Training.Batch), int64(m.Training.Seq), m.Hidden, m.FFN
	e := int64(4)
	if got, want := saved("int8")-saved("nf4"), e*b*s*(2*h+f); got != want {
		t.Errorf("int8 layer keeps %d bytes more than nf4, want %d (inputs of o, gate/up, down)", got, want)
	}
}

// TestDeepSpeedStep follows DeepSpeed's step over a rank's partition of P
// parameters: under ZeRO 1/2 (stage_1_and_2.py) the bf16 gradients (2P),
// their flat copy (2P) and its fp32 conversion (4P), then the update of
// the fp32 partition by PyTorch's AdamW; under ZeRO 3 (stage3.py) the
// same but the gradients, one buffer held all step (kept). The bf16
// for-loop cases are DeepSpeed 0.16.4's on the CPU over a 4-layer Llama
// of 180,800 parameters on 2 ranks, read from the allocator's events:
// from the state without the gradients, 361,600 B for the fp32
// gradients, then 361,600 B for the square root and 361,600 B for the
// quotient, 1,084,800 B in all, at every stage.
func TestDeepSpeedStep(t *testing.T) {
	const p = 90400
	for _, tt := range []struct {
		opt         ir.Optimizer
		kept        bool
		grads, want int64
	}{
		{"adamw-forloop", false, 2 * p, 12 * p},
		{"adamw-foreach", false, 2 * p, 8 * p},
		{"adamw-fused", false, 2 * p, 8 * p},   // the conversion: 2P + 2P + 4P
		{"adamw-fused", false, 4 * p, 8 * p},   // fp32: the gradients and their flat copy, which the conversion returns
		{"adamw-foreach", false, 4 * p, 8 * p}, // fp32: the flat gradients and the square root
		{"sgd", false, 2 * p, 8 * p},
		{"adamw8bit", false, 2 * p, 8 * p},
		{"adamw-forloop", true, 2 * p, 12 * p},
		{"adamw-foreach", true, 2 * p, 8 * p},
		{"adamw-fused", true, 2 * p, 6 * p}, // the flat copy and its conversion
		{"adamw-fused", true, 4 * p, 4 * p}, // fp32: the flat copy only
		{"sgd", true, 2 * p, 6 * p},
	} {
		held := tt.grads
		if tt.kept {
			held = 0
		}
		if got := deepSpeedStep(tt.grads, held, 4*p, optimizers[tt.opt]); got != tt.want {
			t.Errorf("%s over %d B of gradients (kept %v): %d, want %d", tt.opt, tt.grads, tt.kept, got, tt.want)
		}
	}
}

// TestStaticZeRO3Engines: under ZeRO 3 DeepSpeed keeps a gradient bucket
// (the largest layer's gradients, as its export sets reduce_bucket_size)
// all step and converts the kept gradient partition to fp32 in its step;
// FSDP2 has neither, and makes the shards of the gradients in the
// backward, the root's (its embedding, head and final norm) when it ends;
// its layers' gathers are counted at FSDP2's moments, DeepSpeed's
// bounded. Everything else is the same. Llama 3 8B on 8 ranks,
// bf16, fused AdamW: a layer's gradients are 2·218,112,000 B; the step
// is the flat copy (2Ψ/8) and its fp32 conversion (4Ψ/8).
func TestStaticZeRO3Engines(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	m := *src.Model
	m.Training.Optimizer = "adamw-fused"
	m.Training.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: 3}
	fsdp := analyzeModel(t, &m).Static
	m.Training.Parallel.Sharding = "deepspeed"
	ds := analyzeModel(t, &m).Static
	psi := ds.Parameters
	layer := int64(4096*4096*2 + 4096*1024*2 + 3*4096*14336 + 2*4096)
	want := fsdp
	want.add(Bucket, 2*layer)
	want.StepBytes = (2 + 4) * psi / 8
	if root := int64(2 * (2*128256*4096 + 4096) / 8); fsdp.Gather.RootShard != root {
		t.Errorf("fsdp2: the root's shard %d, want %d", fsdp.Gather.RootShard, root)
	}
	// DeepSpeed gathers module by module (TestDeepSpeedPrefetch): nothing
	// held the whole forward and backward.
	want.StepFreedBytes -= want.Of(Gathered)
	want.add(Gathered, -want.Of(Gathered))
	want.Gather.RootShard, want.Gather.FSDP2 = 0, false
	if ds.Gather.DeepSpeed == nil {
		t.Fatal("deepspeed: no gathers counted module by module")
	}
	want.Gather.DeepSpeed = ds.Gather.DeepSpeed
	if diff := cmp.Diff(want, ds); diff != "" {
		t.Errorf("deepspeed against fsdp2 (-want +got)\n%s", diff)
	}
	if fsdp.Of(Bucket) != 0 || fsdp.StepBytes != 0 {
		t.Errorf("fsdp2: bucket %d, step %d; want none (fused AdamW over the shards)", fsdp.Of(Bucket), fsdp.StepBytes)
	}
}

// TestStaticDDP: data parallelism without ZeRO is PyTorch's
// DistributedDataParallel, whose buckets hold a copy of every trained
// gradient the whole step (measured: 3,977,728 B of buckets for a Llama
// of 994,432 fp32 parameters over two gloo ranks,
// python/tests/test_step_peak.py): 2Ψ for Llama 3 8B in bf16, the
// adapters' gradients under LoRA; none on one rank, under ZeRO (its
// engines reduce through buckets of their own, Reduce) or under the
// megatron profile (Megatron-LM's gradient buffer).
func TestStaticDDP(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		dp, zero int64
		profile  ir.Profile
		lora     int64
		want     func(st Static) int64
	}{
		{"ddp", 8, 0, "transformers", 0, func(st Static) int64 { return 2 * st.Parameters }},
		// Rank 16 on q (4096 → 4096) and v (4096 → 1024), 32 layers, bf16.
		{"ddp lora", 8, 0, "transformers", 16, func(Static) int64 { return 2 * 32 * 16 * (4096 + 4096 + 4096 + 1024) }},
		{"one rank", 1, 0, "transformers", 0, func(Static) int64 { return 0 }},
		{"zero 1", 8, 1, "transformers", 0, func(Static) int64 { return 0 }},
		{"megatron", 8, 0, "megatron", 0, func(Static) int64 { return 0 }},
	} {
		m := *src.Model
		m.Training.Parallel = ir.Parallel{DP: tt.dp, TP: 1, Zero: tt.zero}
		m.Training.Profile = tt.profile
		if tt.lora > 0 {
			m.Training.LoRA = ir.LoRA{Rank: tt.lora, Targets: []ir.LoRATarget{"q", "v"}}
		}
		st := analyzeModel(t, &m).Static
		if want := tt.want(st); st.Of(Bucket) != want {
			t.Errorf("%s: buckets %d, want %d", tt.name, st.Of(Bucket), want)
		}
	}
}

// TestTermsRegistered: a term listed in Terms is counted in Total and
// StepFreedBytes, reported by Of, and placed in Terms' order, with no
// other change: what "adding a memory term" (README) promises.
func TestTermsRegistered(t *testing.T) {
	seen := map[string]bool{}
	for _, term := range Terms {
		if term.Name == "" || seen[term.Name] || term.count == nil || term.Describe == nil {
			t.Errorf("term %q: a name of its own, a count and a description are each required", term.Name)
		}
		seen[term.Name] = true
	}
	m := &graphio.Model{Name: "s", Family: "llama", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, FFN: 128, Vocab: 100, Training: ir.DefaultSetup()}
	m.Training.Optimizer = "adamw-fused"
	before := analyzeModel(t, m).Static
	probe := &Term{Name: "probe", count: func(r *rankTally) (int64, int64) { return r.static.WeightsBytes / 2, 100 },
		Describe: func(_ *ir.Setup, _ Static, b mem.Bytes) string { return fmt.Sprintf("probe %v", b) }}
	saved := Terms
	Terms = append([]*Term{probe}, saved...)
	defer func() { Terms = saved }()
	after := analyzeModel(t, m).Static
	half := before.WeightsBytes / 2
	if after.Of(probe) != half || after.Total() != before.Total()+half || after.StepFreedBytes != before.StepFreedBytes+100 {
		t.Errorf("with a probe of %d bytes (100 freed): %d of it, total %d from %d, step frees %d from %d",
			half, after.Of(probe), after.Total(), before.Total(), after.StepFreedBytes, before.StepFreedBytes)
	}
	want := append([]Held{{"probe", half}}, before.Terms...)
	if diff := cmp.Diff(want, after.Terms); diff != "" {
		t.Errorf("terms (-want +got)\n%s", diff)
	}
	if len(before.Terms) < 2 {
		t.Errorf("terms %v: want the step counters and the buffers at least", before.Terms)
	}
}

// TestFSDP2ShardsPlaced: where FSDP2 makes the gradients' shards in the
// backward (ShardsInBackward), every shard the static memory counts is
// placed once, the layers' with their nodes' backwards (ParamGrads) and
// the root's when the backward ends (RootShard), and none is held the
// whole step: full fine-tuning, and LoRA, whose frozen root makes none.
func TestFSDP2ShardsPlaced(t *testing.T) {
	for _, lora := range []int64{0, 8} {
		src, err := graphio.Load("tiny-llama")
		if err != nil {
			t.Fatal(err)
		}
		m := src.Model
		m.Training.Parallel = ir.Parallel{DP: 2, TP: 1, Zero: 3}
		if lora > 0 {
			m.Training.LoRA = ir.LoRA{Rank: lora, Targets: []ir.LoRATarget{"q", "v"}}
		}
		c := analyzeModel(t, m)
		if !c.GradientsInBackward() {
			t.Fatalf("LoRA %d: the shards are not made in the backward", lora)
		}
		placed := c.Static.Gather.RootShard
		for i, pg := range c.ParamGrads {
			if _, ok := ir.LayerIndex(c.Graph.Nodes[i].Block); ok {
				placed += pg.Keep
			}
		}
		if placed != c.Static.GradientsBytes {
			t.Errorf("LoRA %d: %d bytes of shards placed, want the %d the static memory counts", lora, placed, c.Static.GradientsBytes)
		}
		if got, want := c.HeldBytes(), c.Static.Total()-c.Static.GradientsBytes; got != want {
			t.Errorf("LoRA %d: held %d, want all but the shards, %d", lora, got, want)
		}
	}
}
