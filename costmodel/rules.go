package costmodel

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
)

// Profile names a set of rules for what autograd keeps: the setup's
// profile.
type Profile = ir.Profile

// The profiles.
const (
	// Transformers is Hugging Face transformers' layers on PyTorch 2.x,
	// measured there: mean keeps no input, GPT-2's gelu_new and its
	// tensor-valued attention scale keep what their Python ops keep, and
	// sdpa lays its output out so that merging the heads is a view.
	Transformers = ir.ProfileTransformers
	// TorchEager is the same layers on PyTorch 1.13.
	TorchEager = ir.ProfileTorchEager
	Megatron   = ir.ProfileMegatron
)

// keeps lists what a node keeps for its backward, as storages: existing
// ones (its inputs' storages) or new ones it allocates (masks, statistics,
// copies). It is the one place that states each op's rule; docs/costmodel.md
// restates it in prose.
func (a *analyzer) keeps(n *ir.Node) {
	g := a.g
	in := func(i int) int { return a.lay.out[n.Inputs[i]] }
	inNode := func(i int) *ir.Node { return &g.Nodes[n.Inputs[i]] }
	grad := func(i int) bool { return a.grad[n.Inputs[i]] }
	x := func() *ir.Node { return inNode(0) }
	switch n.Op {
	case ir.Linear:
		// The weight's gradient needs the input; under torch.autocast the
		// input's needs the weight's 16-bit copy, an activation. Autograd
		// packs mm's weight first, addmm's (with a bias) second.
		var copy16 int
		if n.Attrs.Autocast && grad(0) {
			w := ir.Shape{n.Attrs.Out, x().Shape.Last()}
			copy16 = a.extra(n, WeightCopy, w, x().DType, a.shard[n.ID])
			if !n.Attrs.Bias {
				a.keep(n, copy16)
			}
		}
		if !n.Attrs.Frozen || (grad(0) && int8Weight(g, n)) {
			a.keep(n, a.operand(n, 0))
		}
		if n.Attrs.Autocast && grad(0) && n.Attrs.Bias {
			a.keep(n, copy16)
		}
		if n.Attrs.LoRARank > 0 {
			a.keepLoRA(n)
			if a.profile == Transformers {
				a.keepHost(n, WrappedScalarBytes) // PEFT's product with its scaling, a Python number
			}
		}
	case ir.MatMul:
		// Autograd saves the second operand (the first's gradient needs
		// it) before the first, as it packs them.
		if grad(0) {
			a.keep(n, a.operand(n, 1))
		}
		if grad(1) {
			a.keep(n, a.operand(n, 0))
		}
	case ir.Mul:
		if grad(0) {
			a.keep(n, in(1))
		}
		if grad(1) {
			a.keep(n, in(0))
		}
	case ir.LayerNorm:
		a.keep(n, in(0))
		// native_layer_norm keeps mean and rstd, Megatron's fused kernel
		// does not: the CPU's in the input dtype, CUDA's in fp32 (its
		// accumulation type) under the transformers profile.
		stat := append(x().Shape[:len(x().Shape)-1].Clone(), 1)
		dt := x().DType
		if cudaKernels(a.profile, &a.g.Setup) {
			dt = ir.FP32
		}
		mean := a.extra(n, Mean, stat, dt, a.shard[n.Inputs[0]])
		rstd := a.extra(n, Rstd, stat, dt, a.shard[n.Inputs[0]])
		if a.profile != Megatron {
			a.keep(n, mean)
			a.keep(n, rstd)
		}
	case ir.RMSNorm:
		a.keepRMSNorm(n)
	case ir.Softmax, ir.LogSoftmax, ir.Tanh, ir.Sigmoid:
		a.keep(n, a.lay.out[n.ID])
	case ir.TopK, ir.SumNorm, ir.Dispatch, ir.ExpertLinear, ir.RouteWeights, ir.Combine:
		a.keepRouting(n)
	case ir.Dropout:
		// The CPU kernel keeps the scaled mask in the input dtype; CUDA's
		// fused kernel (and Megatron's) a 1-byte mask.
		dt := a.maskDType(x().DType)
		a.keep(n, a.extra(n, Mask, x().Shape, dt, a.shard[n.Inputs[0]]))
	case ir.GELU, ir.SiLU:
		a.keep(n, in(0))
		if n.Op == ir.GELU && n.Attrs.TanhPy && a.profile == Transformers {
			// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): pow keeps x,
			// tanh its result, the last product both its factors; the
			// three products with a Python number keep it, wrapped.
			sh := a.shard[n.Inputs[0]]
			a.keep(n, a.extra(n, Tanh, x().Shape, x().DType, sh))
			a.keep(n, a.extra(n, HalfX, x().Shape, x().DType, sh))
			a.keep(n, a.extra(n, OnePlusTanh, x().Shape, x().DType, sh))
			if grad(0) {
				a.keepHost(n, 3*WrappedScalarBytes)
			}
		}
	case ir.Scale:
		switch {
		case n.Attrs.TensorConst && a.profile == Transformers && grad(0):
			// Dividing by a 0-dim tensor keeps the divisor, unless it
			// is one of the model's buffers (counted with them).
			if !n.Attrs.Buffer {
				a.keep(n, a.extra(n, Divisor, ir.Shape{1}, x().DType, false))
			}
		case !n.Attrs.TensorConst && !n.Attrs.ScalarArg && a.profile == Transformers && grad(0):
			// A product with (or quotient by) a Python number keeps the
			// number, wrapped, in host memory.
			a.keepHost(n, WrappedScalarBytes)
		}
	case ir.CrossEntropy:
		// log_softmax keeps its output; nll_loss the targets.
		// A loss that shifts the logits by a copy (LossShiftCopy) takes
		// the log-softmax of the first s−1 positions, and nll_loss keeps
		// the contiguous copy of the last s−1 targets.
		sh := x().Shape
		shift := a.g.Setup.Numerics.LossShiftCopy && len(sh) >= 3 && sh[len(sh)-2] > 1
		if shift {
			sh = sh.Clone()
			sh[len(sh)-2]--
		}
		a.keep(n, a.extra(n, LogSoftmax, sh, x().DType, a.shard[n.Inputs[0]]))
		if shift {
			a.keep(n, a.extra(n, ShiftLabels, sh[:len(sh)-1], ir.Int64, false))
		}
		if src := &a.g.Nodes[n.Inputs[0]]; a.profile == Transformers && src.Op == ir.Cast {
			// The loss upcasts the logits (logits.float()) while the
			// model's output still holds them in its dtype: they live
			// until the loss's forward is done.
			a.c.reads[n.ID] = append(a.c.reads[n.ID], a.lay.out[src.Inputs[0]])
		}
		if h := headInput(a.g, n); a.profile == Transformers && h >= 0 {
			// transformers computes the loss inside the model's forward,
			// whose output object (last_hidden_state) holds the head's
			// input until it returns: under LoRA, where nothing saves it,
			// it lives until the loss's forward is done.
			a.c.reads[n.ID] = append(a.c.reads[n.ID], a.lay.out[h])
		}
		if a.profile == Transformers {
			// nll_loss keeps the count it divides by, a 0-dim tensor in
			// the log-probabilities' dtype. (PyTorch frees it once
			// nll_loss's backward has run, before log_softmax's: a
			// cross_entropy node frees it after both.)
			a.keep(n, a.extra(n, TotalWeight, ir.Shape{1}, x().DType, false))
		}
	case ir.Attention:
		a.keepAttention(n)
	case ir.Aten:
		a.keepTraced(n)
	case ir.RoPE:
		if n.Attrs.Tables {
			t := ir.Shape{1, 1, x().Shape[2], x().Shape[3]}
			a.keep(n, a.extra(n, RopeCos, t, x().DType, false))
			a.keep(n, a.extra(n, RopeSin, t, x().DType, false))
		}
	case ir.Embedding, ir.Add, ir.CausalMask, ir.RepeatKV, ir.Cast,
		ir.Reshape, ir.Transpose, ir.Split, ir.Input:
		// Embedding keeps its ids, scale a float64 scalar, causal_mask a bool
		// buffer, rope its cos/sin buffers: none of them activations.
	default:
		panic(fmt.Sprintf("costmodel: no rule for op %v", n.Op))
	}
}

// headInput returns the node whose output the head (the linear the loss
// node reads the logits of, through casts and reshapes) reads: the
// model's last hidden state; -1 when the loss reads no linear.
func headInput(g *ir.Graph, loss *ir.Node) int {
	id := loss.Inputs[0]
	for g.Nodes[id].Op == ir.Cast || g.Nodes[id].Op == ir.Reshape {
		id = g.Nodes[id].Inputs[0]
	}
	if g.Nodes[id].Op != ir.Linear {
		return -1
	}
	return g.Nodes[id].Inputs[0]
}

// keepTraced keeps what the tracer saw a PyTorch op save, in its order:
// its inputs' storages and its outputs, each extra output a storage of
// its own whether or not it is kept.
func (a *analyzer) keepTraced(n *ir.Node) {
	a.keepHost(n, n.Attrs.HostBytes)
	extras := make([]int, len(n.Attrs.Extras))
	for k, x := range n.Attrs.Extras {
		extras[k] = a.extra(n, ExtraRole(k+1), x.Shape, x.DType, false)
	}
	for _, r := range n.Attrs.Saves {
		switch {
		case !r.Output:
			a.keep(n, a.lay.out[n.Inputs[r.In]])
		case r.In == 0:
			a.keep(n, a.lay.out[n.ID])
		default:
			a.keep(n, extras[r.In-1])
		}
	}
}

// maskDType is the dtype a dropout of an input in dt keeps its mask in.
func (a *analyzer) maskDType(dt ir.DType) ir.DType {
	if a.profile == Megatron || a.g.Setup.Numerics.ByteMasks {
		return ir.Bool
	}
	return dt
}

// keepLoRA keeps what an adapter y += B(A(dropout(x)))·(alpha/r) needs:
// A's gradient needs its input (x itself, or the dropout's output, with
// the mask when x needs a gradient); B's gradient needs A's output, r
// wide. fp32 adapters over 16-bit weights (PEFT's default) first cast x
// to fp32, and the dropout and both products run in fp32.
func (a *analyzer) keepLoRA(n *ir.Node) {
	if n.Attrs.Autocast {
		a.keepLoRAAutocast(n)
		return
	}
	x := &a.g.Nodes[n.Inputs[0]]
	sh := a.shard[n.Inputs[0]]
	dt, in := x.DType, a.operand(n, 0)
	if a.g.Setup.LoRA.FP32 && dt != ir.FP32 {
		dt = ir.FP32
		in = a.extra(n, LoRAInput, x.Shape, dt, sh)
	}
	if n.Attrs.LoRADrop > 0 {
		mask := a.extra(n, LoRADropoutMask, x.Shape, a.maskDType(dt), sh)
		if a.grad[n.Inputs[0]] {
			a.keep(n, mask) // only x's gradient reads it
		}
		a.keep(n, a.extra(n, LoRADropout, x.Shape, dt, sh))
	} else {
		a.keep(n, in)
	}
	s := x.Shape.Clone()
	s[len(s)-1] = n.Attrs.LoRARank
	a.keep(n, a.extra(n, LoRAA, s, dt, false))
}

// keepLoRAAutocast is keepLoRA under torch.autocast over fp32 weights:
// PEFT casts x to the adapter's fp32 (a copy when x is 16-bit) and drops
// out in fp32 (its mask kept when x needs a gradient); A's product casts
// that to 16 bits again (a new copy, kept) and its weight (kept when x
// needs a gradient); B's keeps its weight's copy and A's 16-bit output.
// Autograd packs each product's weight copy before its input.
func (a *analyzer) keepLoRAAutocast(n *ir.Node) {
	x := &a.g.Nodes[n.Inputs[0]]
	sh, r, in := a.shard[n.Inputs[0]], n.Attrs.LoRARank, x.Shape.Last()
	if n.Attrs.LoRADrop > 0 {
		mask := a.extra(n, LoRADropoutMask, x.Shape, a.maskDType(ir.FP32), sh)
		if a.grad[n.Inputs[0]] {
			a.keep(n, mask)
		}
		a.extra(n, LoRADropout, x.Shape, ir.FP32, sh) // read by A's cast only
	}
	if a.grad[n.Inputs[0]] {
		a.keep(n, a.extra(n, LoRAAWeight, ir.Shape{r, in}, x.DType, false))
	}
	a.keep(n, a.extra(n, LoRAInput, x.Shape, x.DType, sh))
	a.keep(n, a.extra(n, LoRABWeight, ir.Shape{n.Attrs.Out, r}, x.DType, false))
	s := x.Shape.Clone()
	s[len(s)-1] = r
	a.keep(n, a.extra(n, LoRAA, s, x.DType, false))
}

// keepRMSNorm follows Hugging Face's LlamaRMSNorm: x.to(fp32);
// pow(2).mean(-1) keeps x and x² (mean keeps its input); rsqrt keeps its
// result; x·rstd keeps both (already counted); .to(dtype) copies; the
// multiply by the weight keeps the normalized x if the weight trains.
// Without the upcast every intermediate is in the model dtype. Gemma's
// (OnePlus) always computes in fp32 and scales by 1 + w before the cast.
// Megatron's fused kernel keeps the input alone (its statistics are not
// counted).
func (a *analyzer) keepRMSNorm(n *ir.Node) {
	x := &a.g.Nodes[n.Inputs[0]]
	sh := a.shard[n.Inputs[0]]
	if a.profile == Megatron {
		// The fused kernel computes rstd and keeps only its input.
		a.extra(n, Rstd, append(x.Shape[:len(x.Shape)-1].Clone(), 1), x.DType, sh)
		a.keep(n, a.lay.out[n.Inputs[0]])
		return
	}
	dt := x.DType
	if n.Attrs.Upcast || n.Attrs.OnePlus {
		dt = ir.FP32
	}
	xf := a.lay.out[n.Inputs[0]]
	if dt != x.DType {
		xf = a.extra(n, XFP32, x.Shape, dt, sh)
	}
	a.keep(n, xf)
	if a.profile == Transformers {
		// PyTorch 2's mean keeps only its input's shape.
		a.extra(n, XSquared, x.Shape, dt, sh)
	} else {
		a.keep(n, a.extra(n, XSquared, x.Shape, dt, sh))
	}
	stat := append(x.Shape[:len(x.Shape)-1].Clone(), 1)
	rstd := a.extra(n, Rstd, stat, dt, sh)
	a.keep(n, rstd)
	a.keep(n, xf)
	a.keep(n, rstd)
	normed := a.extra(n, Normalized, x.Shape, dt, sh)
	if n.Attrs.OnePlus {
		// Gemma: (x·rstd)·(1 + w.float()), then cast back. The product
		// keeps 1 + w for the input's gradient, x·rstd for the weight's.
		w := a.extra(n, OnePlusWeight, ir.Shape{x.Shape.Last()}, ir.FP32, false)
		if a.grad[n.Inputs[0]] {
			a.keep(n, w)
		}
		if !n.Attrs.Frozen {
			a.keep(n, normed)
		}
		if n.DType != ir.FP32 {
			a.extra(n, Scaled, x.Shape, ir.FP32, sh)
		}
		return
	}
	if dt != n.DType {
		normed = a.extra(n, NormalizedCast, x.Shape, n.DType, sh)
	}
	if !n.Attrs.Frozen {
		a.keep(n, normed)
	}
}

// keepAttention is the fused attention op. Flash attention keeps q, k, v,
// its output and the fp32 log-sum-exp (b·a·s), never the s² probabilities.
// The eager fused op keeps what the unfused chain keeps: q, k and v, the
// probabilities, and with dropout the mask and the dropped probabilities.
func (a *analyzer) keepAttention(n *ir.Node) {
	q := &a.g.Nodes[n.Inputs[0]]
	// Autograd packs k before q: sdpa's key and q·kᵀ's second operand.
	// PyTorch 2's sdpa saves q, k and v as they are passed, views
	// included (transformers before 4.48 passes views); elsewhere the
	// kernel works on contiguous q, k, v and a strided one is copied.
	operand := a.operand
	if n.Attrs.Flash && a.profile == Transformers {
		if !a.g.Setup.Numerics.SDPAContiguous {
			operand = func(n *ir.Node, i int) int { return a.lay.out[n.Inputs[i]] }
		}
		if n.Attrs.MaskKept {
			// Packed first; made from the model's mask by the layer, in
			// q's dtype (16 bits under torch.autocast).
			mask := ir.Shape{q.Shape[0], 1, q.Shape[2], a.g.Nodes[n.Inputs[1]].Shape[2]}
			a.keep(n, a.extra(n, AttnMask, mask, q.DType, false))
		}
	}
	a.keep(n, operand(n, 1))
	a.keep(n, operand(n, 0))
	sh := a.shard[n.ID]
	if n.Attrs.Flash {
		a.keep(n, operand(n, 2))
		out := a.lay.out[n.ID]
		lseShape := q.Shape[:3].Clone()
		cudaSDPA := cudaKernels(a.profile, &a.g.Setup) && a.g.Setup.Attention == ir.AttentionSDPA
		efficient := cudaSDPA && q.DType == ir.FP32
		if efficient {
			// CUDA runs fp32 sdpa on its memory-efficient kernel, whose
			// log-sum-exp has a row for every 32 positions begun.
			lseShape[2] = (lseShape[2] + 31) / 32 * 32
		}
		lse := a.extra(n, LogSumExp, lseShape, ir.FP32, sh)
		if efficient {
			// Its philox seed and offset, two int64 in host memory.
			a.keepHost(n, 16)
		}
		if a.profile == Transformers {
			// PyTorch 2's sdpa backward saves the log-sum-exp first.
			a.keep(n, lse)
			a.keep(n, out)
			if cudaSDPA && !efficient {
				// Then CUDA's flash kernel its philox seed and offset,
				// int64 on the GPU, dropout or not (the memory-efficient
				// kernel keeps its own in host memory).
				a.keep(n, a.extra(n, RNGState, ir.Shape{1}, ir.Int64, false))
				a.keep(n, a.extra(n, RNGOffset, ir.Shape{1}, ir.Int64, false))
			}
			return
		}
		a.keep(n, out)
		a.keep(n, lse)
		return
	}
	// softmax(q·kᵀ) keeps its output, dropout its mask, and the product
	// with v keeps v, then the (dropped) probabilities.
	probs := ir.Shape{q.Shape[0], q.Shape[1], q.Shape[2], a.g.Nodes[n.Inputs[1]].Shape[2]}
	a.keep(n, a.extra(n, Probs, probs, q.DType, sh))
	if n.Attrs.P > 0 {
		a.keep(n, a.extra(n, Mask, probs, a.maskDType(q.DType), sh))
		a.keep(n, a.operand(n, 2))
		a.keep(n, a.extra(n, Dropped, probs, q.DType, sh))
		return
	}
	a.keep(n, a.operand(n, 2))
}

// operand returns the storage a matmul or linear keeps for input i: the
// input's own storage when it is contiguous, else the contiguous copy the
// kernel makes of it.
func (a *analyzer) operand(n *ir.Node, i int) int {
	id := n.Inputs[i]
	if a.lay.contig[id] || n.Op == ir.MatMul && MatMulTakesView(a.profile, &a.g.Nodes[id]) {
		return a.lay.out[id]
	}
	role := CopyRole(i)
	if k := a.made(n.ID, role); k >= 0 {
		return k
	}
	in := &a.g.Nodes[id]
	return a.extra(n, role, in.Shape, in.DType, a.shard[id])
}

// MatMulTakesView reports whether torch.matmul takes its operand x as it
// is, strided, rather than a contiguous copy: for one sequence it drops
// the batch axis and hands bmm the view (bmm reads matrices whose rows are
// dense, at any strides: heads transposed out of [b, s, heads, d], one
// key/value head repeated with stride 0). With more sequences it folds
// batch and heads into one axis, which copies a strided tensor. Megatron-LM
// multiplies its own [s, b·heads, d] layout, as its figures count it.
func MatMulTakesView(p Profile, x *ir.Node) bool {
	return p != Megatron && len(x.Shape) == 4 && x.Shape[0] == 1
}

// copyOperands makes the contiguous copies a product kernel needs of its
// strided operands, whether or not the backward keeps them: the kernel
// copies either way, and an unkept copy is a transient.
func (a *analyzer) copyOperands(n *ir.Node) {
	switch n.Op {
	case ir.MatMul, ir.Linear, ir.Attention:
		for i := range n.Inputs {
			a.operand(n, i)
		}
	}
}

// keepRouting is a mixture of experts as transformers' sparse MoE blocks
// run it (MixtralSparseMoeBlock): topk keeps its indices; dividing the
// chosen weights by their sum in place keeps the sum and a copy of them;
// each expert's torch.where makes its (slot, token) pairs, which indexing
// the tokens, indexing the weights and index_add_ keep; the experts'
// linears keep their inputs as any linear does; index_add_ also keeps
// the rows it adds (its source), whose shape its backward needs. Experts run one after
// another on their own rows: here their rows are one [rows, h] tensor
// grouped by expert, the same bytes and the same products whatever the
// routing, since every token sends k rows.
func (a *analyzer) keepRouting(n *ir.Node) {
	x := &a.g.Nodes[n.Inputs[0]]
	sh := a.shard[n.Inputs[0]]
	switch n.Op {
	case ir.TopK:
		a.keep(n, a.extra(n, Indices, n.Shape, ir.Int64, sh))
	case ir.SumNorm:
		sum := a.extra(n, Sum, append(x.Shape[:len(x.Shape)-1].Clone(), 1), x.DType, sh)
		cp := a.extra(n, InputCopy, x.Shape, x.DType, sh)
		a.keep(n, sum)
		a.keep(n, cp)
	case ir.Dispatch:
		// The topk's indices, read to route.
		a.c.reads[n.ID] = []int{a.routing(n.Inputs[1], Indices)}
		a.keep(n, a.extra(n, Route, ir.Shape{n.Shape[0], 2}, ir.Int64, sh))
	default:
		// The dispatch's route, and for the experts' products the topk's
		// indices, which say whose rows they are.
		d := &a.g.Nodes[n.Inputs[1]]
		route := a.routing(d.ID, Route)
		a.c.reads[n.ID] = []int{route}
		if n.Op == ir.Combine && a.grad[n.Inputs[0]] {
			// index_add_'s backward shapes the rows' gradient after its
			// source, which autograd therefore keeps.
			a.keep(n, a.lay.out[n.Inputs[0]])
		}
		if n.Op == ir.ExpertLinear {
			a.c.reads[n.ID] = append(a.c.reads[n.ID], a.routing(d.Inputs[1], Indices))
			if !n.Attrs.Frozen {
				a.keep(n, a.operand(n, 0))
			}
		}
		for _, s := range a.c.reads[n.ID] {
			a.keep(n, s)
		}
	}
}

// routing returns the storage node id allocates in a role: the routing
// state a later op of its mixture of experts reads.
func (a *analyzer) routing(id int, role Role) int {
	k := a.made(id, role)
	if k < 0 {
		panic(fmt.Sprintf("costmodel: %s allocates no %v", a.g.Nodes[id].Name, role))
	}
	return k
}

// made returns the storage node id has allocated in a role so far, or
// −1 when it has none.
func (a *analyzer) made(id int, role Role) int {
	for k := a.firstOwned[id]; k < len(a.c.Storages); k++ {
		if s := &a.c.Storages[k]; s.Node == id && s.Role == role {
			return k
		}
	}
	return -1
}
