package costmodel

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
)

// Static is the memory of one rank that does not depend on the schedule:
// weights, their gradients, the optimizer state and the Terms beside
// them.
type Static struct {
	Parameters          int64 // of the whole model
	TrainableParameters int64 // of the whole model
	WeightsBytes        int64 // on one rank
	GradientsBytes      int64 // on one rank
	OptimizerBytes      int64 // on one rank, fp32 master weights included
	// Terms are what each registered Term (Terms) holds on the rank, in
	// Terms' order, those that hold nothing left out.
	Terms []Held
	// CallArgs are what the model makes each forward and hands every
	// decoder layer's call (term_buffers.go): the positions and eager
	// attention's masks under the transformers profile. Not in Total:
	// PyTorch frees them with the forward unless a checkpointed or
	// selective layer's call holds them to its backward.
	CallArgs int64
	// Gather is what ZeRO stage 3 holds at its moments beyond what
	// Gathered counts: a decoder layer's unsharded weights while it runs,
	// forward and backward, the next layer's all-gather, a layer's
	// unsharded gradients until they are reduce-scattered, and the root's
	// gradients from the head's backward to the backward's end. Zero
	// without stage 3.
	Gather Gather
	// Buckets are what DeepSpeed's ZeRO stages 1 and 2 hold to reduce
	// the gradients, counted buffer by buffer where ckptplan knows the
	// graph's modules (deepSpeedBuckets), in place of the Reduce term and
	// of stage 2's gradients held all step; nil otherwise.
	Buckets *DeepSpeedBuckets
	// LayerParams and LayerTrainable are the largest decoder layer's
	// parameters and trainable parameters on one tensor-parallel rank,
	// counted under ZeRO: the sizes the engines' gathering and gradient
	// buckets are set from (the DeepSpeed export's reduce_bucket_size and
	// stage3_* settings).
	LayerParams, LayerTrainable int64
	// Paged: the optimizer is one of bitsandbytes' paged optimizers.
	// PagedBytes are the part of OptimizerBytes it keeps in CUDA unified
	// memory, which the driver moves to the host when the GPU runs short:
	// the two moments of each trained tensor of minPagedSize elements or
	// more (bitsandbytes' get_state_buffer). PagedTensorBytes are the
	// largest tensor's, which its step brings back to the GPU to update
	// (prefetch_state). A plan counts them on the GPU, and pages out only
	// what the GPU cannot hold otherwise (planner.Plan.PagedOutBytes).
	Paged                        bool
	PagedBytes, PagedTensorBytes int64
	// StepBytes is the optimizer step's working memory beside the state
	// (stepWorkspace, or deepSpeedStep under DeepSpeed's ZeRO): live
	// only while the step runs, so not in Total.
	StepBytes int64
	// StepFreedBytes are the bytes of Total the step no longer holds:
	// those each Term says (the rotary tables and positions a forward
	// makes, freed with the backward's graph; under ZeRO stage 3, what it
	// gathered; under ZeRO stages 1 and 2, the reduce buffers, freed when
	// the backward ends) and, under DeepSpeed's ZeRO with an optimizer,
	// the 16-bit gradients, which it turns into an fp32 partition
	// (counted in StepBytes) before it updates.
	StepFreedBytes int64
}

// Largest names the largest part of the static memory, the first of
// equals: weights, gradients, optimizer state or one of the Terms.
func (s Static) Largest() (name string, bytes int64) {
	name, bytes = "weights", s.WeightsBytes
	for _, part := range []Held{{"gradients", s.GradientsBytes}, {"optimizer state", s.OptimizerBytes}} {
		if part.Bytes > bytes {
			name, bytes = part.Term, part.Bytes
		}
	}
	for _, h := range s.Terms {
		if h.Bytes > bytes {
			name, bytes = h.Term, h.Bytes
		}
	}
	return name, bytes
}

// Total returns the static bytes of one rank.
func (s Static) Total() int64 {
	total := s.WeightsBytes + s.GradientsBytes + s.OptimizerBytes
	for _, h := range s.Terms {
		total += h.Bytes
	}
	return total
}

// GradientsInBackward reports whether the parameter gradients appear as
// the backward makes them, instead of living the whole step: PyTorch's
// AccumulateGrad keeps the first gradient a backward makes for a
// parameter, and zero_grad (set_to_none, its default) frees them all
// after the optimizer step, so without gradient accumulation they are
// live from their backward to the step. Not under ZeRO (DeepSpeed and
// FSDP manage their own gradient buffers), with gradients reduced once
// a step (NoSync), under the megatron profile (Megatron-LM's gradient
// buffer is allocated once, contiguous), or when nothing trains.
func GradientsInBackward(g *ir.Graph) bool {
	s := g.Setup
	return s.GradAccum < 2 && s.Parallel.Zero == 0 && !s.Parallel.NoSync &&
		s.Profile != Megatron && s.Optimizer != ir.OptimizerNone
}

// ShardsInBackward reports whether ZeRO stage 3 makes the rank's shard of
// each group's gradients in the backward, instead of holding every shard
// the whole step: FSDP2 (fully_shard) reduce-scatters a group's gradients
// into a new shard once its backward has run, and zero_grad (set_to_none)
// frees them all after the optimizer step; DeepSpeed keeps its flat
// buffer. Not with gradients reduced once a step, accumulated over
// micro-batches, or with nothing to train.
func ShardsInBackward(g *ir.Graph) bool {
	s := g.Setup
	return s.Parallel.Zero >= 3 && s.Parallel.Sharder() == ir.ShardingFSDP2 && s.GradAccum < 2 &&
		!s.Parallel.NoSync && s.Profile != Megatron && s.Optimizer != ir.OptimizerNone
}

// fsdp2Accumulates reports whether FSDP2 (ZeRO stage 3 under fully_shard)
// reduce-scatters each micro-batch's gradients of a step of several into
// the shards it holds the whole step: gradient accumulation with the
// gradients reduced every backward (not no_sync).
func fsdp2Accumulates(g *ir.Graph) bool {
	s := g.Setup
	return s.Parallel.Zero >= 3 && s.Parallel.Sharder() == ir.ShardingFSDP2 && s.GradAccum >= 2 &&
		!s.Parallel.NoSync && s.Profile != Megatron && s.Optimizer != ir.OptimizerNone
}

// AccumulatesGradients reports whether a backward after the first of a
// step adds its parameter gradients into those held (PyTorch's
// AccumulateGrad: the new gradient made apart, added in place, freed):
// gradient accumulation without ZeRO (DeepSpeed and FSDP accumulate in
// buffers of their own) or the megatron profile (Megatron-LM's fused
// accumulation into its gradient buffer).
func AccumulatesGradients(g *ir.Graph) bool {
	s := g.Setup
	return s.GradAccum >= 2 && s.Parallel.Zero == 0 && s.Profile != Megatron
}

// ParamGrad is where node's backward puts parameter gradients, when they
// appear in the backward: Keep, the bytes it makes and keeps to the
// optimizer step; Apart, those it makes apart and adds into a gradient an
// earlier backward made (the embedding a later head's weight is tied to);
// Unsharded, under FSDP2, the node's unsharded gradient beyond what it
// keeps, held to its layer's reduce-scatter, the end of the layer's
// backward: beyond its shard where the shards are made in the backward
// (ShardsInBackward), the whole gradient where they are held whole over
// several micro-batches.
type ParamGrad struct{ Keep, Apart, Unsharded int64 }

// paramGrads returns each node's ParamGrad: a node's trainable parameters
// (split over tp ranks, tpShard) in the gradient's dtype (paramSizes), as
// staticOf counts them. A tied weight's gradient is made by the backward
// that reaches it first, its last user's; its other users make theirs
// apart.
func paramGrads(g *ir.Graph) []ParamGrad {
	out := make([]ParamGrad, len(g.Nodes))
	first := make([]int, len(g.Nodes)) // the node whose backward makes node i's weight gradient
	for i := range g.Nodes {
		first[i] = i
		if t := g.Nodes[i].Attrs.Tied; t != "" {
			if h, ok := g.Lookup(t); ok {
				first[h] = max(first[h], i)
			}
		}
	}
	for i := range g.Nodes {
		h := i
		if t := g.Nodes[i].Attrs.Tied; t != "" {
			var ok bool
			if h, ok = g.Lookup(t); !ok {
				continue
			}
		}
		_, _, gradSize := paramSizes(g, h)
		b := tpShard(g, h, g.TrainableParams(h)) * gradSize
		if i == first[h] {
			out[i].Keep = b
		} else {
			out[i].Apart = b
		}
	}
	return out
}

// tpShard returns the part of n of node i's parameters one
// tensor-parallel rank holds: linears and embeddings are split over tp,
// norms replicated.
func tpShard(g *ir.Graph, i int, n int64) int64 {
	if op := g.Nodes[i].Op; op == ir.Linear || op == ir.Embedding {
		return ceilDiv(n, max(g.Setup.Parallel.TP, 1))
	}
	return n
}

// paramSizes returns the bytes of one parameter of node i, of one
// trainable parameter and of its gradient. A traced op's parameters may be
// in a dtype of their own; PEFT's adapters over 16-bit weights are fp32,
// as are their gradients; Megatron-LM accumulates and reduces 16-bit
// training's gradients in fp32 buffers (its default for bf16, the
// main_grad of every parameter): 2 + 4 + 12 = 18 bytes a parameter under
// AdamW.
func paramSizes(g *ir.Graph, i int) (weight, train, grad int64) {
	s := g.Setup
	e := g.DType.Size()
	n := &g.Nodes[i]
	weight = e
	if n.Op == ir.Aten && n.Attrs.ParamDType != ir.Invalid {
		weight = n.Attrs.ParamDType.Size()
	}
	train = weight
	if s.LoRA.FP32 && s.LoRA.Rank > 0 && e < 4 {
		train = 4
	}
	grad = train
	if s.Profile == Megatron && e < 4 {
		grad = 4
	}
	return weight, train, grad
}

// staticMemory follows the usual mixed-precision accounting (Rajbhandari
// et al. 2020, ZeRO, §3): weights and gradients in the training dtype;
// AdamW keeps two fp32 moments per trainable parameter, and 16-bit training
// an fp32 master copy. Only trainable parameters (LoRA adapters, under
// LoRA) have gradients and optimizer state. Tensor parallelism splits the
// weights of linears and embeddings over tp ranks (norms are replicated);
// ZeRO stage 1 splits the optimizer state over dp ranks, stage 2 also the
// gradients, stage 3 (FSDP's full sharding) also the weights. LoRA
// adapters kept in fp32 over 16-bit weights need no master copy; nor do a
// traced op's parameters in a dtype of their own that is 32 bits wide.
// Gradients reduced once a step (Parallel.NoSync) are held whole between
// microbatches: not split over dp whatever the stage. Under the megatron
// profile 16-bit gradients are fp32, as Megatron-LM keeps them.
func staticMemory(g *ir.Graph) (Static, error) {
	return staticOf(g, func(int) bool { return true })
}

// StaticOf is the static memory of a device that holds the given nodes'
// weights, as a pipeline stage does: theirs, and, for a node whose weight
// is tied to a node the device does not hold (the head of the last stage,
// tied to the first stage's embedding), a copy of that weight with its
// own gradient and optimizer state, as Megatron-LM keeps; the rotary
// tables when it holds a node that reads them. Parameters and
// TrainableParameters count the device's weights.
func StaticOf(g *ir.Graph, nodes []int) (Static, error) {
	held, err := heldBy(g, nodes)
	if err != nil {
		return Static{}, err
	}
	return staticOf(g, func(i int) bool { return held[i] })
}

// heldBy returns which of g's nodes' weights a pipeline device that runs
// the given nodes holds: theirs, and the node a weight of theirs is tied
// to.
func heldBy(g *ir.Graph, nodes []int) ([]bool, error) {
	held := make([]bool, len(g.Nodes))
	for _, i := range nodes {
		if i < 0 || i >= len(g.Nodes) {
			return nil, fmt.Errorf("graph %s has no node %d", g.Name, i)
		}
		held[i] = true
		if t := g.Nodes[i].Attrs.Tied; t != "" {
			if j, ok := g.Lookup(t); ok {
				held[j] = true
			}
		}
	}
	return held, nil
}

// staticOf is staticMemory over the nodes held says.
func staticOf(g *ir.Graph, held func(int) bool) (Static, error) {
	s := g.Setup
	e := g.DType.Size()
	if e == 0 {
		return Static{}, fmt.Errorf("graph %s has no dtype", g.Name)
	}
	dp := max(s.Parallel.DP, 1)
	opt, ownDType, ok := optimizerOf(s)
	if !ok {
		return Static{}, fmt.Errorf("unknown optimizer %q (valid: %s)", s.Optimizer, ir.Join(ir.Optimizers(), ", "))
	}
	var params, trainable, weights, grads, moments, masters, dequant, tensors int64
	var paged, pagedTensor int64 // bitsandbytes' unified memory: all of it, and the largest tensor's
	var trainedShard int64       // the trained parameters on this tensor-parallel rank
	var approx float64           // bytes, in float64: it cannot wrap
	eightBitState := false       // some tensor's moments are 8-bit
	// The unsharded weights and gradients of each decoder layer, and of
	// the rest (the root, to FSDP), for ZeRO stage 3's working set.
	layerW, layerG := map[int]int64{}, map[int]int64{}
	layerP, layerT := map[int]int64{}, map[int]int64{}
	var rootW, rootG int64
	for i := range g.Nodes {
		if !held(i) {
			continue
		}
		n := &g.Nodes[i]
		p, tr := g.Params(i), g.TrainableParams(i)
		params += p
		trainable += tr
		p, tr = tpShard(g, i, p), tpShard(g, i, tr)
		trainedShard += tr
		size, trainSize, gradSize := paramSizes(g, i)
		approx += float64(p) * float64(2*max(size, trainSize)+16)
		w0 := weights
		weights += (p-tr)*size + tr*trainSize
		grads += tr * gradSize
		tensors += int64(len(trainableTensors(g, i)))
		if trainSize < 4 {
			masters += tr
		}
		if opt.paged {
			for _, t := range trainableTensors(g, i) {
				if t = tpShard(g, i, t); t >= minPagedSize {
					b := 2 * t * opt.momentBytes()
					paged += b
					pagedTensor = max(pagedTensor, b)
				}
			}
		}
		if opt.eightBit {
			for _, t := range trainableTensors(g, i) {
				t = tpShard(g, i, t)
				moments += adam8bitBytes(t)
				eightBitState = eightBitState || t >= min8bitSize
			}
		} else if ownDType {
			moments += tr * opt.moments / 4 * trainSize
		} else {
			moments += tr * opt.moments
		}
		if s.Quant != "" {
			for _, q := range quantizedWeights(g, i) {
				q.elems, q.rows = tpShard(g, i, q.elems), tpShard(g, i, q.rows)
				weights += quantBytes(q, s.Quant, s.DoubleQuant) - q.elems*e
				dequant = max(dequant, q.elems*e)
			}
		}
		if k, ok := ir.LayerIndex(n.Block); ok {
			layerW[k] += weights - w0
			layerG[k] += tr * gradSize
			layerP[k] += p
			layerT[k] += tr
		} else {
			rootW += weights - w0
			rootG += tr * gradSize
		}
	}
	// Each count fits (ir checks every weight's size); their sums and
	// products with bytes per parameter must too.
	if approx > 1<<62 {
		return Static{}, fmt.Errorf("graph %s: its weights, gradients and optimizer state pass 2^62 bytes: too large to count", g.Name)
	}
	st := Static{
		Parameters: params, TrainableParameters: trainable,
		WeightsBytes:   weights,
		GradientsBytes: grads,
		OptimizerBytes: moments,
		Paged:          opt.paged,
		PagedBytes:     paged, PagedTensorBytes: pagedTensor,
	}
	if opt.master {
		st.OptimizerBytes += masters * 4 // the fp32 master copy of 16-bit trained weights
	}
	if s.Parallel.Zero >= 1 {
		st.OptimizerBytes = ceilDiv(st.OptimizerBytes, dp)
		// Each rank pages its shards; DeepSpeed's optimizer sees one flat
		// partition of the rank's trained parameters, paged whole where
		// it is large enough, and updated as one tensor.
		st.PagedBytes = min(ceilDiv(paged, dp), st.OptimizerBytes)
		st.PagedTensorBytes = min(ceilDiv(pagedTensor, dp), st.PagedBytes)
		if s.Parallel.Sharder() == ir.ShardingDeepSpeed {
			st.PagedBytes, st.PagedTensorBytes = 0, 0
			if n := ceilDiv(trainedShard, dp); opt.paged && n >= minPagedSize {
				st.PagedBytes = min(2*n*opt.momentBytes(), st.OptimizerBytes)
				st.PagedTensorBytes = st.PagedBytes
			}
		}
	}
	if eightBitState {
		// The optimizer's two quantization maps, 256 fp32 values each,
		// moved to the device with the first 8-bit state and shared by
		// every tensor it trains.
		st.OptimizerBytes += 2 * 256 * 4
	}
	if s.Parallel.Zero >= 2 && !s.Parallel.NoSync {
		st.GradientsBytes = ceilDiv(st.GradientsBytes, dp)
	}
	var w, lg int64 // the largest layer's unsharded weight and gradient bytes
	for k := range layerW {
		w, lg = max(w, layerW[k]), max(lg, layerG[k])
	}
	if s.Parallel.Zero >= 1 {
		for k := range layerP {
			st.LayerParams, st.LayerTrainable = max(st.LayerParams, layerP[k]), max(st.LayerTrainable, layerT[k])
		}
	}
	if s.Parallel.Zero >= 3 {
		st.WeightsBytes = ceilDiv(st.WeightsBytes, dp)
		st.Gather = Gather{RootWeights: rootW, RootGrads: rootG, LayerWeights: w, LayerGrads: lg}
		if s.Parallel.Sharder() == ir.ShardingDeepSpeed && s.Profile != Megatron && holdsAll(g, held) {
			st.Gather.DeepSpeed = deepSpeedGathers(g, e, e, dp, max(st.LayerParams, 1), max(st.LayerTrainable, 1))
		}
		if s.Parallel.Reshard == ir.ReshardAllButLast {
			last := -1
			for k := range layerW {
				last = max(last, k)
			}
			if last >= 0 {
				st.Gather.LastWeights = layerW[last]
			}
		}
	}
	if z := s.Parallel.Zero; (z == 1 || z == 2) && s.Parallel.Sharder() == ir.ShardingDeepSpeed && s.Profile != Megatron &&
		!s.Parallel.NoSync && s.GradAccum < 2 && s.Optimizer != ir.OptimizerNone && trainable > 0 && holdsAll(g, held) {
		st.Buckets = deepSpeedBuckets(g, z, e, dp, max(st.LayerTrainable, 1))
	}
	countTerms(&rankTally{g: g, held: held, opt: opt, tensors: tensors, dequant: dequant, grads: grads, rootG: rootG, layerG: lg, static: &st})
	st.CallArgs = callArgs(g, held)
	st.StepBytes = stepWorkspace(g, held, opt)
	if s.Parallel.Zero >= 1 {
		st.StepBytes = ceilDiv(st.StepBytes, dp)
	}
	if s.Parallel.Sharder() == ir.ShardingDeepSpeed && !s.Parallel.NoSync && s.Profile != Megatron && s.Optimizer != ir.OptimizerNone && trainable > 0 {
		partition := int64(4) // DeepSpeed's fp32 partition of the trained weights
		if ownDType {
			partition = e
		}
		// Stages 1 and 2 free the gradient partition once it is
		// converted, which holds every parameter with an element in the
		// rank's share, whole, where DeepSpeedBuckets counts it; stage
		// 3's is one buffer, held all step.
		share := ceilDiv(grads, dp)
		held := share
		if s.Parallel.Zero >= 3 {
			held = 0
		} else {
			st.StepFreedBytes += st.GradientsBytes
		}
		if st.Buckets != nil {
			held = max(held, st.Buckets.Partition)
		}
		st.StepBytes = deepSpeedStep(share, held, partition*ceilDiv(trainedShard, dp), opt)
	}
	return st, nil
}

// deepSpeedStep is what DeepSpeed's ZeRO allocates in its step
// (stage_1_and_2.py and stage3.py, step) beside the weights and the
// optimizer state, once the backward has freed its reduce buffers: the
// rank's gradient partition (grads bytes, in the gradients' dtype) is
// flattened into one tensor and converted to the dtype of the rank's
// master partition (master bytes; when the dtypes agree the flat copy is
// the converted one), and the optimizer updates the master partition as
// one tensor. Stages 1 and 2 hold the buffer the partition is a view of
// (held bytes) until the conversion and free it before the update;
// stage 3 keeps it (held 0: its gradients are one buffer, counted all
// step, not here). PyTorch's AdamW over one tensor makes a master-sized square root
// (foreach), a square root and a quotient (for-loop), or nothing (fused);
// the all-gather of the updated weights then writes into the weights
// themselves. The most held is the larger of the conversion (the
// partition's buffer unless kept, the flat copy, the converted copy) and
// the update (the converted gradients and the optimizer's working
// memory).
func deepSpeedStep(grads, held, master int64, opt optimizer) int64 {
	converted := master
	if grads == master {
		converted = 0
	}
	var work int64
	if opt.moments > 0 && !opt.eightBit && !opt.paged {
		work = [...]int64{forEach: 1, fused: 0, forLoop: 2}[opt.impl] * master
	}
	return max(held+grads+converted, master+work)
}

// stepWorkspace is what PyTorch's AdamW allocates while its step runs,
// beside the state it updates in place (torch/optim/adamw.py):
//
//   - foreach (adamw, adamw-foreach; PyTorch's default when every
//     parameter is on a GPU) takes the square root of every second
//     moment at once (_foreach_sqrt) and divides and adds into it: one
//     moment-sized tensor for every trained tensor of the group;
//   - for-loop (adamw-forloop; the default on the CPU) makes the
//     denominator of one tensor at a time, its square root and the
//     quotient both live, while the previous tensor's denominator is
//     still bound to its variable: the most of twice a trained tensor's
//     moment and the one before it's, in the parameters' order;
//   - fused (adamw-fused) updates in one kernel: nothing.
//
// A moment has its parameter's dtype, or fp32 with a master copy. SGD
// without momentum, bitsandbytes' optimizers (in-place kernels) and none
// make nothing.
func stepWorkspace(g *ir.Graph, held func(int) bool, opt optimizer) int64 {
	if opt.moments == 0 || opt.eightBit || opt.paged || opt.impl == fused {
		return 0
	}
	var sum, loop, prev int64
	for i := range g.Nodes {
		if !held(i) || g.TrainableParams(i) == 0 {
			continue
		}
		_, train, _ := paramSizes(g, i)
		if opt.master && train < 4 {
			train = 4
		}
		for _, t := range trainableTensors(g, i) {
			t = tpShard(g, i, t) * train
			sum += t
			loop = max(loop, 2*t+prev)
			prev = t
		}
	}
	if opt.impl == forLoop {
		return loop
	}
	return sum
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// holdsAll reports whether held holds every node of g.
func holdsAll(g *ir.Graph, held func(int) bool) bool {
	for i := range g.Nodes {
		if !held(i) {
			return false
		}
	}
	return true
}

// Gather is what ZeRO stage 3 gathers and reduce-scatters, as PyTorch's
// FSDP2 runs it with each decoder layer and the root (the model: the
// embedding, the final norm, the head) passed to fully_shard, each
// layer's weights resharded after its forward (fully_shard's default) and
// the root's kept to the backward (its default for the root).
//
// Every all-gather of a group (a layer, or the root) writes into an
// output buffer of the group's unsharded bytes (all ranks' shards) and
// copies it out into the unsharded weights, held while the group runs.
// In the forward the buffer lives until the next group's gather has
// been issued (implicit prefetch), the last one until the model's forward
// returns, the loss included; in the backward the root's pre-backward
// hook gathers the last layer ahead, and each layer's the layer before
// it (explicit prefetch), once it has copied out its own buffer and freed
// it. So one output buffer is held through the forward and backward
// (Gathered counts it with the root's weights), but in the first
// layer's backward, which has none to prefetch. Beside it a layer's
// forward holds its weights (Weights), and the first layer's gather, for
// a moment, the root's buffer too (RootWeights); a layer's backward holds
// its weights and the buffer it prefetched, at its start its own buffer
// instead of the prefetched one.
//
// When a layer's backward has run, its post-backward hook reshards its
// weights, copies its gradients into a reduce-scatter input and frees
// them, and reduce-scatters the input into the rank's shard
// (ShardsInBackward: GradientsBytes, counted where each node's backward
// runs, with the unsharded gradient beyond the shard, ParamGrad.Unsharded,
// held from there to this hook). The input is kept until the next
// group's reduce-scatter starts: through the backward of the layer
// before. The root's gradients are reduce-scattered once the whole
// backward is done: held unsharded from the backward that makes each on,
// and reduced through two more of their size. The root's weights are
// resharded then, so the step holds none of what was gathered.
//
// These moments are FSDP2's as it runs under NCCL, counted event by event
// (FSDP2; measured under gloo on the CPU, where each collective adds a
// temporary of its output's size for its duration, and a non-reentrant
// checkpoint, whose recomputation runs no hook: torch.utils.checkpoint's
// reentrant variant gathers a layer again when it recomputes it and its
// misdirected prefetches hold one output buffer for each layer done until
// the backward ends). PyTorch from 2.9 gathers nothing on one rank. Over
// several micro-batches a step FSDP2 reduce-scatters every backward and
// adds into the shards the step holds: the same moments. Where the
// gradients are not reduce-scattered layer by layer (reduced once a step),
// a layer is bounded instead (ForwardBytes, BackwardBytes). DeepSpeed's
// stage 3 gathers module by module (DeepSpeed), and is bounded so where
// ckptplan does not know the graph's modules.
type Gather struct {
	RootWeights, RootGrads   int64 // the root's unsharded weights and gradients
	LayerWeights, LayerGrads int64 // the largest decoder layer's unsharded weights and gradients
	// RootShard is the rank's shard of the root's gradients where the
	// shards are made in the backward (ShardsInBackward): the last
	// reduce-scatter's, when the backward ends. 0 otherwise.
	RootShard int64
	// LastWeights are the last decoder layer's unsharded weights where
	// FSDP2 keeps them gathered from its forward to its backward
	// (ir.ReshardAllButLast): beside what Gathered holds through the
	// stages after it, the head's forward and the loss, until the
	// backward starts, where the root's prefetch of that layer, which
	// Gathered counts, gathers nothing. 0 otherwise.
	LastWeights int64
	// FSDP2: the moments are FSDP2's, each layer's by its place
	// (Layer), where it reduce-scatters every backward (ShardsInBackward,
	// or over micro-batches into the shards held); otherwise every layer
	// is bounded by ForwardBytes and BackwardBytes.
	FSDP2 bool
	// DeepSpeed is what DeepSpeed's stage 3 holds, module by module,
	// where ckptplan knows the graph's modules (deepSpeedGathers): in
	// place of the root's weights, the output buffer and the bounds, and
	// of the gradients until the bucket takes them. nil otherwise.
	DeepSpeed *DeepSpeedGathers
}

// ForwardBytes bounds what a decoder layer's forward holds gathered beside
// what Gathered holds where the moments are not FSDP2's: its weights, two
// more output buffers (or one and gloo's temporary) and, in a
// recomputation, the last reduce-scatter's input.
func (g Gather) ForwardBytes() int64 { return 3*g.LayerWeights + g.LayerGrads }

// BackwardBytes bounds what a decoder layer's backward holds gathered
// beside what Gathered holds and its gradients' shard, where the moments
// are not FSDP2's: what its forward does, and its unsharded gradients or
// gloo's copy of them.
func (g Gather) BackwardBytes() int64 { return 3*g.LayerWeights + 2*g.LayerGrads }

// LayerGather is what ZeRO stage 3 holds while a decoder layer runs,
// beside what Gathered holds: in its forward and its backward, to be
// added to its kernels' own transient bytes, and at the start of each,
// before any kernel of it runs (a floor under the sum).
type LayerGather struct {
	Forward, ForwardStart   int64
	Backward, BackwardStart int64
}

// Layer returns what a decoder layer holds gathered beside Gathered, first
// and last saying whether it is the first or last layer the forward runs.
// Under FSDP2: its weights in the forward, and at the first layer's start
// the root's output buffer; in the backward its weights and the buffer it
// prefetched (none in the first layer) and the reduce-scatter input of the
// layer after it (none in the last), and at its start its own buffer
// beside its weights and that input. Otherwise the bounds, at every
// layer.
func (g Gather) Layer(first, last bool) LayerGather {
	if !g.FSDP2 {
		return LayerGather{Forward: g.ForwardBytes(), Backward: g.BackwardBytes()}
	}
	var l LayerGather
	w, gr := g.LayerWeights, g.LayerGrads
	l.Forward = w
	if first {
		l.ForwardStart = g.RootWeights
	}
	if !first {
		l.Backward += w
	}
	if !last {
		l.Backward += gr
		l.BackwardStart += gr
	}
	l.BackwardStart += w
	return l
}

// LayerBytes is the most a decoder layer gathers beside what Gathered holds
// while it runs, forward or backward, wherever it runs.
func (g Gather) LayerBytes() int64 {
	if g.DeepSpeed != nil {
		return g.DeepSpeed.Most()
	}
	if g.FSDP2 {
		l := g.Layer(false, false)
		return max(l.Forward, l.Backward, l.BackwardStart)
	}
	return max(g.ForwardBytes(), g.BackwardBytes())
}

// StartBytes is what the root's gather holds beside what Gathered holds when
// the forward starts, before the first layer's, where no layer's buffer is
// held yet: its output buffer beside the root's weights, and gloo's
// temporary where the moments are not FSDP2's.
func (g Gather) StartBytes() int64 {
	if g.DeepSpeed != nil {
		return 0
	}
	if g.FSDP2 {
		return max(g.RootWeights-g.LayerWeights, 0)
	}
	return max(2*g.RootWeights-g.LayerWeights, 0)
}

// optimizerOf returns the optimizer a setup trains with, and ownDType
// where it keeps its moments in the weights' dtype with no master copy
// (PyTorch's own optimizers over 16-bit weights, MasterNone); false for
// an optimizer ckptplan does not know.
func optimizerOf(s ir.Setup) (opt optimizer, ownDType, ok bool) {
	opt, ok = optimizers[s.Optimizer]
	ownDType = s.MasterWeights == ir.MasterNone && opt.master
	if ownDType {
		opt.master = false
	}
	return opt, ownDType, ok
}

// An optimizer is what an optimizer keeps for the weights it trains.
type optimizer struct {
	moments  int64 // bytes a trained parameter, in fp32 (two moments: 8)
	eightBit bool  // two moments a byte each, blockwise (adam8bitBytes), instead
	master   bool  // an fp32 master copy of weights trained in 16 bits (mixed precision)
	paged    bool  // its state in CUDA unified memory (bitsandbytes' paged optimizers)
	impl     stepImpl
	// counter: PyTorch's AdamW counts its steps in a 0-dim fp32 tensor a
	// trained tensor, on the device when fused (or on the CPU the step
	// runs on), on the host otherwise; bitsandbytes' in a Python int.
	counter bool
}

// stepImpl is how PyTorch's AdamW runs its step (stepWorkspace).
type stepImpl uint8

const (
	forEach stepImpl = iota
	fused
	forLoop
)

// optimizers are the optimizers ckptplan knows (ir.Optimizers), "" being
// AdamW. PyTorch's keep a master copy under mixed precision;
// bitsandbytes' update the weights in their own dtype.
var optimizers = map[ir.Optimizer]optimizer{
	"":                         {moments: 8, master: true, counter: true},
	ir.OptimizerAdamW:          {moments: 8, master: true, counter: true},
	ir.OptimizerAdamWForeach:   {moments: 8, master: true, counter: true},
	ir.OptimizerAdamWFused:     {moments: 8, master: true, impl: fused, counter: true},
	ir.OptimizerAdamWForLoop:   {moments: 8, master: true, impl: forLoop, counter: true},
	ir.OptimizerSGD:            {master: true},
	ir.OptimizerNone:           {},
	ir.OptimizerAdamW8bit:      {eightBit: true},
	ir.OptimizerPagedAdamW8bit: {eightBit: true, paged: true},
	ir.OptimizerPagedAdamW:     {moments: 8, paged: true},
}

// OptimizerName says which optimizer a setup names, and how PyTorch's
// AdamW runs its step: "AdamW (foreach)" for adamw.
func OptimizerName(name ir.Optimizer) string {
	o := optimizers[name]
	switch {
	case name == ir.OptimizerNone:
		return "no optimizer"
	case o.moments == 0 || o.eightBit || o.paged: // SGD, bitsandbytes'
		return string(name)
	}
	return "AdamW (" + [...]string{"foreach", "fused", "for-loop"}[o.impl] + ")"
}

// Bitsandbytes reports whether the named optimizer is one of
// bitsandbytes' (8-bit or paged).
func Bitsandbytes(name ir.Optimizer) bool {
	o := optimizers[name]
	return o.eightBit || o.paged
}

// min8bitSize is bitsandbytes' min_8bit_size: a smaller tensor's
// optimizer state stays fp32.
const min8bitSize = 4096

// minPagedSize is the least elements of a tensor whose state a paged
// bitsandbytes optimizer keeps in unified memory (get_state_buffer: a
// smaller one's is an ordinary tensor on the GPU).
const minPagedSize = 100_000

// momentBytes is the bytes of one of a paged optimizer's moments an
// element, for a tensor of minPagedSize elements or more: a byte 8-bit,
// fp32 otherwise. (The 8-bit blocks' maxima are ordinary tensors.)
func (o optimizer) momentBytes() int64 {
	if o.eightBit {
		return 1
	}
	return 4
}

// adam8bitBytes is what bitsandbytes' 8-bit AdamW keeps for a trained
// tensor of n elements (Dettmers et al. 2022, 8-bit Optimizers via
// Block-wise Quantization): its two moments a byte each, quantized in
// blocks of 256 with an fp32 absolute maximum a block; a tensor under
// 4,096 elements (min_8bit_size) keeps them in fp32. The two quantization
// maps the optimizer shares are counted once, in staticOf.
func adam8bitBytes(n int64) int64 {
	if n < min8bitSize {
		return 8 * n
	}
	return 2 * (n + 4*ceilDiv(n, 256))
}

// quantWeight is one quantized weight: its elements and output rows.
type quantWeight struct{ elems, rows int64 }

// quantizedWeights returns the weights of node i that bitsandbytes
// quantizes when a model is loaded in 4 or 8 bits: the frozen weights of
// the decoder layers' linears and experts (each expert's its own; the
// embeddings, the head, the norms and the biases stay in the training
// dtype, as transformers leaves them).
func quantizedWeights(g *ir.Graph, i int) []quantWeight {
	n := &g.Nodes[i]
	if _, layer := ir.LayerIndex(n.Block); !n.Attrs.Frozen || n.Attrs.Tied != "" || !layer {
		return nil
	}
	in := g.Nodes[n.Inputs[0]].Shape.Last()
	switch n.Op {
	case ir.Linear:
		return []quantWeight{{in * n.Attrs.Out, n.Attrs.Out}}
	case ir.ExpertLinear:
		w := make([]quantWeight, n.Attrs.Experts)
		for e := range w {
			w[e] = quantWeight{in * n.Attrs.Out, n.Attrs.Out}
		}
		return w
	}
	return nil
}

// int8Weight reports whether linear n's weight is stored in int8
// (LLM.int8()). bitsandbytes' 8-bit product keeps its input for the
// backward whether or not the weight trains (MatMul8bitLt's ctx.tensors on
// CUDA, MatMul8bitFp's ctx.A on the CPU); the 4-bit one keeps only the
// weight.
func int8Weight(g *ir.Graph, n *ir.Node) bool {
	return g.Setup.Quant == ir.QuantInt8 && len(quantizedWeights(g, n.ID)) > 0
}

// quantBytes is the memory of a weight stored as quant says
// (bitsandbytes): nf4 and fp4 pack two values a byte and keep an fp32
// absolute maximum for each block of 64 (Dettmers et al. 2023, QLoRA,
// §3); double quantization stores those maxima as a byte each, in blocks
// of 256 with an fp32 maximum a block, and one fp32 offset (0.127 bits a
// parameter instead of 0.5). int8 keeps a byte a value and an fp32 scale a
// row (Dettmers et al. 2022, LLM.int8()). Each 4-bit weight also keeps its
// own copy of the quantization maps (bitsandbytes 0.48's QuantState): the
// 16 fp32 values of nf4 or fp4, and with double quantization the 256 of
// the maxima's 8-bit map.
func quantBytes(q quantWeight, quant ir.Quant, double bool) int64 {
	if quant == ir.QuantInt8 {
		return q.elems + 4*q.rows
	}
	blocks := ceilDiv(q.elems, 64)
	if double {
		return ceilDiv(q.elems, 2) + blocks + 4*ceilDiv(blocks, 256) + 4 + 16*4 + 256*4
	}
	return ceilDiv(q.elems, 2) + 4*blocks + 16*4
}

// trainableTensors returns the element counts of the tensors node i
// trains, one by one, as an optimizer sees them: a linear's weight and
// bias, or its LoRA adapter's two matrices; an embedding's table; each
// expert's weight; a norm's scale and shift. A traced op's are one.
func trainableTensors(g *ir.Graph, i int) []int64 {
	n := &g.Nodes[i]
	if g.TrainableParams(i) == 0 {
		return nil
	}
	switch n.Op {
	case ir.Linear:
		in := g.Nodes[n.Inputs[0]].Shape.Last()
		if n.Attrs.Frozen {
			return []int64{n.Attrs.LoRARank * in, n.Attrs.Out * n.Attrs.LoRARank}
		}
		t := []int64{in * n.Attrs.Out}
		if n.Attrs.Bias {
			t = append(t, n.Attrs.Out)
		}
		if n.Attrs.LoRARank > 0 {
			t = append(t, n.Attrs.LoRARank*in, n.Attrs.Out*n.Attrs.LoRARank)
		}
		return t
	case ir.ExpertLinear:
		t := make([]int64, n.Attrs.Experts)
		for e := range t {
			t[e] = g.TrainableParams(i) / n.Attrs.Experts
		}
		return t
	case ir.LayerNorm:
		return []int64{n.Shape.Last(), n.Shape.Last()}
	}
	return []int64{g.TrainableParams(i)}
}
