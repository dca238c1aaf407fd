package graphio

import (
	"fmt"
	"math"
	"slices"

	"github.com/ckptplan/ckptplan/ir"
)

// Build expands a model into its training graph op by op, in the order
// PyTorch runs the reference implementations (Hugging Face's GPT-2 and
// eager Llama), so that the cost model can match what autograd keeps tensor
// by tensor. Blocks are "embed", "layers.0" … "layers.L-1" and "head"; a
// node's name is its block and its region in the block ("layers.3.attn.q_proj").
// Ops that do nothing in the setup (dropout with p = 0, a cast to the same
// dtype, repeat_kv with one group) are left out.
//
// The graph is O(layers) nodes; Build fails only on a model that Validate
// rejects.
func Build(model *Model) (*ir.Graph, error) {
	m := *model
	m.fillDefaults()
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	dt := m.Training.ModelDType()
	b := &builder{m: &m, g: ir.NewGraph(m.Name, dt), dt: dt}
	if m.Training.Autocast != "" {
		b.half, _ = ir.ParseDType(m.Training.Autocast)
	}
	b.g.Setup = m.Training
	x := b.embed()
	first := len(b.g.Nodes)
	for l := int64(0); l < m.Layers; l++ {
		if l == 1 {
			// Every layer adds as many nodes as the first, the head
			// fewer.
			per := len(b.g.Nodes) - first
			b.g.Grow(per * int(m.Layers))
		}
		b.block, b.layer = fmt.Sprintf("layers.%d", l), l
		if m.Family == "gpt2" {
			x = b.gpt2Layer(x)
		} else {
			x = b.llamaLayer(x)
		}
	}
	b.g.Output = b.head(x)
	if b.err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, b.err)
	}
	return b.g, ir.Validate(b.g)
}

// builder appends nodes to a graph, keeping the first error so that the
// layer functions read as straight-line code.
type builder struct {
	m     *Model
	g     *ir.Graph
	dt    ir.DType
	half  ir.DType // torch.autocast's 16-bit dtype for products; Invalid without autocast
	block string
	layer int64 // the layer being built
	err   error
}

// autocast returns x as torch.autocast hands it to a product: cast to the
// 16-bit dtype, a copy unless it is in it already; x without autocast.
func (b *builder) autocast(region string, x int) int {
	if b.half == ir.Invalid {
		return x
	}
	return b.cast(region, b.half, x)
}

func (b *builder) op(region string, op ir.Op, a ir.Attrs, in ...int) int {
	if b.err != nil {
		return 0
	}
	id, err := b.g.AddOp(b.block+"."+region, b.block, op, a, in...)
	if err != nil {
		b.err = err
	}
	return id
}

func (b *builder) input(name string, shape ir.Shape) int {
	if b.err != nil {
		return 0
	}
	id, err := b.g.AddInput(name, "", ir.Tensor{Shape: shape, DType: ir.Int64})
	if err != nil {
		b.err = err
	}
	return id
}

// fusedRoles are the LoRA targets a fused projection answers to: GPT-2's
// and Phi-3's q, k and v in one, Phi-3's gate and up.
var fusedRoles = map[string][]ir.LoRATarget{"qkv": {ir.LoRAQ, ir.LoRAK, ir.LoRAV}, "gate_up": {ir.LoRAGate, ir.LoRAUp}}

// linear adds a projection; role is the LoRA target it answers to, or a
// fused projection's (fusedRoles).
func (b *builder) linear(region, role string, out int64, bias bool, x int) int {
	a := ir.Attrs{Out: out, Bias: bias, Frozen: b.m.Training.LoRA.Rank > 0}
	targets := b.m.Training.LoRA.Targets
	if a.Frozen && (slices.Contains(targets, ir.LoRATarget(role)) ||
		slices.ContainsFunc(fusedRoles[role], func(t ir.LoRATarget) bool { return slices.Contains(targets, t) })) {
		a.LoRARank = b.m.Training.LoRA.Rank
		a.LoRADrop = b.m.Training.LoRA.Dropout
	}
	if b.half != ir.Invalid {
		// Each product casts its input (again, for every consumer) and
		// its weight.
		x, a.Autocast = b.autocast(region+"_cast", x), true
	}
	return b.op(region, ir.Linear, a, x)
}

func (b *builder) dropout(region string, x int) int {
	if p := b.m.Training.Dropout; p > 0 {
		return b.op(region, ir.Dropout, ir.Attrs{P: p}, x)
	}
	return x
}

func (b *builder) norm(region string, x int) int {
	a := ir.Attrs{Eps: b.m.NormEps, Frozen: b.m.Training.LoRA.Rank > 0}
	if b.m.Family == "gpt2" || b.m.Family == "starcoder2" {
		return b.op(region, ir.LayerNorm, a, x)
	}
	a.Upcast = b.m.Training.Numerics.NormFP32
	a.OnePlus = b.m.Family == "gemma" || b.m.Family == "gemma2"
	return b.op(region, ir.RMSNorm, a, x)
}

func (b *builder) cast(region string, to ir.DType, x int) int {
	if b.err != nil || b.g.Nodes[x].DType == to {
		return x
	}
	return b.op(region, ir.Cast, ir.Attrs{To: to}, x)
}

func (b *builder) embed() int {
	m, t := b.m, &b.m.Training
	frozen := t.LoRA.Rank > 0
	tokens := b.input("tokens", ir.Shape{t.Batch, t.Seq})
	b.block = "embed"
	x := b.op("wte", ir.Embedding, ir.Attrs{Vocab: m.Vocab, Out: m.Hidden, Frozen: frozen}, tokens)
	if m.Family == "starcoder2" {
		x = b.dropout("dropout", x)
	}
	if m.Family == "gpt2" {
		pos := b.input("positions", ir.Shape{t.Seq})
		maxSeq := max(m.MaxSeq, t.Seq)
		wpe := b.op("wpe", ir.Embedding, ir.Attrs{Vocab: maxSeq, Out: m.Hidden, Frozen: frozen}, pos)
		x = b.op("add", ir.Add, ir.Attrs{}, x, wpe)
		x = b.dropout("dropout", x)
	}
	switch m.Family {
	case "gemma", "gemma2":
		// Gemma scales its embeddings by √hidden, a 0-dim tensor in the
		// model dtype, or from 5.4 a buffer in it.
		x = b.op("normalizer", ir.Scale, ir.Attrs{Factor: math.Sqrt(float64(m.Hidden)), TensorConst: true,
			Buffer: b.m.Training.Numerics.GemmaScaleBuffer}, x)
	case "granite":
		x = b.op("multiplier", ir.Scale, ir.Attrs{Factor: m.EmbeddingMultiplier}, x)
	}
	return x
}

func (b *builder) head(x int) int {
	t := &b.m.Training
	targets := b.input("targets", ir.Shape{t.Batch, t.Seq})
	b.block = "head"
	x = b.norm("norm_f", x)
	a := ir.Attrs{Out: b.m.Vocab, Frozen: t.LoRA.Rank > 0}
	if b.m.TiedEmbeddings {
		a.Tied = "embed.wte"
	}
	if b.half != ir.Invalid {
		x, a.Autocast = b.autocast("lm_head_cast", x), true
	}
	logits := b.op("lm_head", ir.Linear, a, x)
	if b.m.Family == "granite" {
		logits = b.op("logits_scaling", ir.Scale, ir.Attrs{Factor: 1 / b.m.LogitsScaling}, logits)
	}
	logits = b.softcap("logit_softcap", b.m.FinalSoftcap, logits)
	if t.Numerics.LogitsFP32 && (b.m.Family != "gpt2" || !t.Numerics.GPT2LossModelDType) {
		logits = b.cast("logits_fp32", ir.FP32, logits)
	}
	return b.op("loss", ir.CrossEntropy, ir.Attrs{}, logits, targets)
}

// heads reshapes [b, s, n·d] to [b, n, s, d]; Qwen 3 normalizes each
// query and key head on the way (q_norm, k_norm, over d).
func (b *builder) heads(region string, n int64, x int) int {
	t := &b.m.Training
	x = b.op(region+"_view", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, t.Seq, n, b.m.HeadDim()}}, x)
	if b.m.Family == "qwen3" && region != "attn.v" {
		x = b.norm(region+"_norm", x)
	}
	return b.op(region+"_heads", ir.Transpose, ir.Attrs{Axis: 1, Axis2: 2}, x)
}

// merge reshapes attention output [b, a, s, d] back to [b, s, h].
func (b *builder) merge(x int) int {
	t := &b.m.Training
	x = b.op("attn.merge_t", ir.Transpose, ir.Attrs{Axis: 1, Axis2: 2}, x)
	return b.op("attn.merge", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, t.Seq, b.m.Heads * b.m.HeadDim()}}, x)
}

// core is the attention of q [b, a, s, d] over k, v [b, kv, s, d]: the
// fused flash kernel, or the eager chain QKᵀ, scale, mask, softmax, dropout,
// ·V with K and V expanded (gqa: repeat) or the queries grouped by kv head.
func (b *builder) core(q, k, v int) int {
	m, t := b.m, &b.m.Training
	kernel := t.Attention
	if kernel == ir.AttentionFlash {
		return b.op("attn.flash", ir.Attention, ir.Attrs{Heads: m.Heads, KVHeads: m.KVHeads, Flash: true, Causal: true, P: t.Dropout}, q, k, v)
	}
	if kernel == ir.AttentionSDPAMath {
		// With enable_gqa (an unmasked layer, 4.54 on) sdpa repeats K
		// and V itself.
		return b.sdpaMath(q, k, v, t.Numerics.SDPAGQA && !b.sdpaMasked())
	}
	if kernel == ir.AttentionSDPA {
		// transformers expands K and V to every query head before
		// F.scaled_dot_product_attention (from 4.54, where the layer has
		// no mask, sdpa takes them unexpanded with enable_gqa), whose
		// fused kernels keep what flash keeps and return [b, s, heads, d]
		// memory.
		kv, masked := m.Heads, b.sdpaMasked()
		if m.KVHeads < m.Heads {
			if t.Numerics.SDPAGQA && !masked {
				if t.Numerics.SDPAGQAMath {
					// No fused kernel takes them: sdpa's math path
					// repeats K and V.
					return b.sdpaMath(q, k, v, true)
				}
				kv = m.KVHeads
			} else {
				k = b.op("attn.repeat_k", ir.RepeatKV, ir.Attrs{Heads: m.Heads}, k)
				v = b.op("attn.repeat_v", ir.RepeatKV, ir.Attrs{Heads: m.Heads}, v)
			}
		}
		// Under autocast sdpa takes q, k and v in 16 bits (copies of the
		// fp32 rotated q and k).
		q, k, v = b.autocast("attn.q_cast", q), b.autocast("attn.k_cast", k), b.autocast("attn.v_cast", v)
		// sdpa keeps the mask it is handed. Before the model made the
		// masks, Gemma 2 passed every layer the model's: the layer's own
		// where a sliding layer windows it into a new one or
		// torch.autocast copies it to 16 bits. Where the model makes
		// them, sdpa converts the boolean mask to q's dtype.
		maskKept := masked && (t.Numerics.ModelMasks || m.Sliding(b.layer) || b.half != ir.Invalid)
		// sdpa lays its output out as q: [b, s, heads, d] where q is
		// the projection's transposed (rotary embeddings keep its
		// strides), unless q was copied contiguous.
		bshd := !t.Numerics.SDPAContiguous && !(m.Family == "phi3" && t.Numerics.Phi3RopeCat)
		mask := ""
		if masked && t.Profile == ir.ProfileTransformers {
			mask = b.modelMask(true)
		}
		return b.op("attn.sdpa", ir.Attention, ir.Attrs{Heads: m.Heads, KVHeads: kv, Flash: true, BSHD: bshd, Causal: true, P: t.Dropout,
			MaskKept: maskKept, ModelMask: mask}, q, k, v)
	}
	grouped := m.KVHeads < m.Heads && t.Numerics.GQA == ir.GQAGrouped
	if m.KVHeads < m.Heads && !grouped {
		k = b.op("attn.repeat_k", ir.RepeatKV, ir.Attrs{Heads: m.Heads}, k)
		v = b.op("attn.repeat_v", ir.RepeatKV, ir.Attrs{Heads: m.Heads}, v)
	}
	if grouped {
		g := m.Heads / m.KVHeads
		q = b.op("attn.group_q", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, m.KVHeads, g * t.Seq, m.HeadDim()}}, q)
	}
	qdt := b.g.Nodes[q].DType // the probabilities come back to it
	q, k = b.autocast("attn.q_cast", q), b.autocast("attn.k_cast", k)
	s := b.op("attn.qk_matmul", ir.MatMul, ir.Attrs{TransposeB: true}, q, k)
	if grouped {
		s = b.op("attn.ungroup_s", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, m.Heads, t.Seq, t.Seq}}, s)
	}
	// GPT-2 divides by torch.full([], √d), a tensor (before transformers
	// 5.4); Llama multiplies by a float.
	gpt2 := m.Family == "gpt2"
	s = b.op("attn.scale", ir.Scale, ir.Attrs{Factor: b.scoreScale(), TensorConst: gpt2 && !t.Numerics.GPT2FloatScale}, s)
	s = b.softcap("attn.softcap", m.AttnSoftcap, s)
	// Under autocast Llama's scores meet its fp32 additive mask and become
	// fp32. GPT-2's torch.where fills in the scores' own dtype; from 4.53
	// it adds the model's mask after it, and from 5.2 only that.
	additive := !gpt2 || t.Numerics.GPT2AdditiveMask || t.Numerics.ModelMasks
	s = b.op("attn.causal_mask", ir.CausalMask, ir.Attrs{Upcast: b.half != ir.Invalid && additive, ModelMask: b.modelMask(additive)}, s)
	if dt := b.g.Nodes[s].DType; t.Profile == ir.ProfileTransformers && t.Numerics.SoftmaxFP32 && dt != ir.FP32 && (dt != ir.FP16 || t.Numerics.CPUKernels) {
		// F.softmax(x, dtype=torch.float32) copies 16-bit scores to
		// fp32 before it runs (only CUDA's fp16 softmax reads 16 bits
		// and writes 32): the copy's gradient is fp32 until its
		// backward casts it back.
		s = b.cast("attn.softmax_in", ir.FP32, s)
	}
	s = b.op("attn.softmax", ir.Softmax, ir.Attrs{Upcast: t.Numerics.SoftmaxFP32}, s)
	s = b.cast("attn.softmax_cast", qdt, s)
	s = b.dropout("attn.attn_dropout", s)
	s, v = b.autocast("attn.p_cast", s), b.autocast("attn.v_cast", v)
	if grouped {
		g := m.Heads / m.KVHeads
		s = b.op("attn.group_p", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, m.KVHeads, g * t.Seq, t.Seq}}, s)
	}
	o := b.op("attn.av_matmul", ir.MatMul, ir.Attrs{}, s, v)
	if grouped {
		o = b.op("attn.ungroup_o", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch, m.Heads, t.Seq, m.HeadDim()}}, o)
	}
	return o
}

// sdpaMasked reports whether transformers hands this layer's sdpa a mask:
// every layer where the batch is padded; in a batch without padding,
// where the model makes the masks, only a sliding layer whose window is
// no longer than the sequence gets one, causal attention being sdpa's
// is_causal; before, Gemma 2's layers always got one and the others none.
func (b *builder) sdpaMasked() bool {
	m, t := b.m, &b.m.Training
	if t.Padded {
		return true
	}
	if t.Numerics.ModelMasks {
		return m.Sliding(b.layer) && t.Seq >= m.SlidingWindow
	}
	return m.Family == "gemma2"
}

// modelMask names the model's mask an eager layer adds to its scores
// (ir.Attrs.ModelMask): under the transformers profile, the model's
// causal mask, or from 4.53 its sliding-window mask in a sliding layer;
// none where GPT-2 masks its scores with its own buffer (before 4.53).
func (b *builder) modelMask(additive bool) string {
	t := &b.m.Training
	switch {
	case t.Profile != ir.ProfileTransformers || !additive:
		return ""
	case t.Numerics.ModelMasks && b.m.Sliding(b.layer):
		return "sliding"
	}
	return "full"
}

// scoreScale is the factor of the attention scores: 1/√head_dim,
// Granite's attention multiplier, or Gemma 2's 1/√query_pre_attn_scalar.
func (b *builder) scoreScale() float64 {
	switch {
	case b.m.Family == "granite":
		return b.m.AttentionMultiplier
	case b.m.QueryScalar > 0:
		return 1 / math.Sqrt(b.m.QueryScalar)
	}
	return 1 / math.Sqrt(float64(b.m.HeadDim()))
}

// softcap is Gemma 2's soft-capping, x/c, tanh, ·c, in x's dtype; x when
// c is 0.
func (b *builder) softcap(region string, c float64, x int) int {
	if c == 0 {
		return x
	}
	x = b.op(region+"_div", ir.Scale, ir.Attrs{Factor: 1 / c}, x)
	x = b.op(region+"_tanh", ir.Tanh, ir.Attrs{}, x)
	return b.op(region+"_mul", ir.Scale, ir.Attrs{Factor: c}, x)
}

// sdpaMath is F.scaled_dot_product_attention on its math path, which
// PyTorch runs where no fused kernel applies (on CPU, any dropout): q, k
// and v upcast to fp32 from 16 bits, q and k each scaled by the root of
// the scale, softmax(q·kᵀ), dropout, the product with v, cast back.
func (b *builder) sdpaMath(q, k, v int, interleave bool) int {
	m := b.m
	if m.KVHeads < m.Heads {
		// transformers' repeat_kv, or sdpa's repeat_interleave of K and
		// V handed unexpanded: the same heads, a copy even of one.
		k = b.op("attn.repeat_k", ir.RepeatKV, ir.Attrs{Heads: m.Heads, Interleave: interleave}, k)
		v = b.op("attn.repeat_v", ir.RepeatKV, ir.Attrs{Heads: m.Heads, Interleave: interleave}, v)
	}
	// Under autocast, sdpa takes 16-bit q, k and v before its math path
	// upcasts them again.
	q, k, v = b.autocast("attn.q_cast", q), b.autocast("attn.k_cast", k), b.autocast("attn.v_cast", v)
	dt := b.g.Nodes[q].DType
	q = b.cast("attn.q_acc", ir.FP32, q)
	k = b.cast("attn.k_acc", ir.FP32, k)
	v = b.cast("attn.v_acc", ir.FP32, v)
	root := math.Sqrt(b.scoreScale())
	q = b.op("attn.q_scaled", ir.Scale, ir.Attrs{Factor: root, ScalarArg: true}, q)
	k = b.op("attn.k_scaled", ir.Scale, ir.Attrs{Factor: root, ScalarArg: true}, k)
	s := b.op("attn.qk_matmul", ir.MatMul, ir.Attrs{TransposeB: true}, q, k)
	// The mask the model hands a masked layer (sdpaMasked) is the
	// layer's call argument, as an eager layer's: the math path adds it
	// and saves none.
	mask := ""
	if b.sdpaMasked() {
		mask = b.modelMask(true)
	}
	s = b.op("attn.causal_mask", ir.CausalMask, ir.Attrs{ModelMask: mask}, s)
	s = b.op("attn.softmax", ir.Softmax, ir.Attrs{Safe: true}, s)
	s = b.dropout("attn.attn_dropout", s)
	o := b.op("attn.av_matmul", ir.MatMul, ir.Attrs{}, s, v)
	return b.cast("attn.out_cast", dt, o)
}

func (b *builder) gpt2Layer(x int) int {
	m := b.m
	h := b.norm("ln_1", x)
	qkv := b.linear("attn.qkv_proj", "qkv", 3*m.Hidden, true, h)
	var qkvs [3]int
	for i, name := range []string{"q", "k", "v"} {
		part := b.op("attn."+name, ir.Split, ir.Attrs{Parts: 3, Index: i}, qkv)
		qkvs[i] = b.heads("attn."+name, m.Heads, part)
	}
	o := b.merge(b.core(qkvs[0], qkvs[1], qkvs[2]))
	o = b.linear("attn.out_proj", "o", m.Hidden, true, o)
	o = b.dropout("attn.resid_dropout", o)
	// GPT2Block's variables: hidden_states holds the first norm's output
	// to the first residual add and the second's to the last, and
	// attn_output the attention's to its end.
	b.holdTo(h, "resid_1")
	b.holdTo(o, "resid_2")
	x = b.op("resid_1", ir.Add, ir.Attrs{}, x, o)
	h = b.norm("ln_2", x)
	b.holdTo(h, "resid_2")
	h = b.linear("mlp.fc1", "up", m.FFN, true, h)
	h = b.op("mlp.gelu", ir.GELU, ir.Attrs{TanhPy: true}, h)
	h = b.linear("mlp.fc2", "down", m.Hidden, true, h)
	h = b.dropout("mlp.resid_dropout", h)
	return b.op("resid_2", ir.Add, ir.Attrs{}, x, h)
}

// holdTo says that the block's code holds node id's output until its
// node region has run (ir.Attrs.HeldTo).
func (b *builder) holdTo(id int, region string) {
	if b.err == nil {
		b.g.Nodes[id].Attrs.HeldTo = b.block + "." + region
	}
}

// llamaLayer is the decoder layer of the rotary families: Llama's, with
// each family's projections (qkv), MLP (mlp) and residual dropout.
func (b *builder) llamaLayer(x int) int {
	m := b.m
	h := b.norm("input_layernorm", x)
	q, k, v := b.qkv(h)
	// Under autocast the 16-bit q and k meet fp32 cos and sin and become
	// fp32, unless the layer makes its tables, in q's dtype.
	nm := &m.Training.Numerics
	inLayer := nm.RopeInLayer || nm.RopeCached
	fp32 := b.half != ir.Invalid && !inLayer
	var cache int64
	if nm.RopeCached {
		cache = max(m.MaxSeq, m.Training.Seq)
	}
	q = b.op("attn.rope_q", ir.RoPE, ir.Attrs{Heads: m.Heads, Theta: m.RopeTheta, Tables: inLayer, CacheLen: cache, Upcast: fp32}, q)
	k = b.op("attn.rope_k", ir.RoPE, ir.Attrs{Heads: m.KVHeads, Theta: m.RopeTheta, Upcast: fp32}, k)
	o := b.merge(b.core(q, k, v))
	o = b.linear("attn.o_proj", "o", m.Hidden, m.OBias, o)
	if m.Family == "phi3" && nm.Phi3AttnOutputs {
		b.holdTo(o, "resid_2")
	}
	o = b.residBranch("attn", o)
	x = b.op("resid_1", ir.Add, ir.Attrs{}, x, o)
	pre := "post_attention_layernorm"
	if m.Family == "gemma2" {
		pre = "pre_feedforward_layernorm" // its post-attention norm is the branch's
	}
	h = b.norm(pre, x)
	if m.Routed(b.layer) {
		h = b.moe(h)
	} else {
		h = b.mlp(h)
	}
	h = b.residBranch("mlp", h)
	return b.op("resid_2", ir.Add, ir.Attrs{}, x, h)
}

// qkv projects the normalized input to q, k and v as [b, heads, s, d]:
// three projections, or Phi-3's one, sliced (q, k and v are views of it).
func (b *builder) qkv(h int) (q, k, v int) {
	m := b.m
	d, kvDim := m.HeadDim(), m.KVHeads*m.HeadDim()
	if m.Family != "phi3" {
		q = b.heads("attn.q", m.Heads, b.linear("attn.q_proj", "q", m.Heads*d, m.QKVBias, h))
		k = b.heads("attn.k", m.KVHeads, b.linear("attn.k_proj", "k", kvDim, m.QKVBias, h))
		v = b.heads("attn.v", m.KVHeads, b.linear("attn.v_proj", "v", kvDim, m.QKVBias, h))
		return q, k, v
	}
	qkv := b.linear("attn.qkv_proj", "qkv", m.Heads*d+2*kvDim, m.QKVBias, h)
	sizes := ir.Shape{m.Heads * d, kvDim, kvDim}
	part := func(name string, i int, heads int64) int {
		return b.heads("attn."+name, heads, b.op("attn."+name, ir.Split, ir.Attrs{Parts: 3, Index: i, Sizes: sizes}, qkv))
	}
	return part("q", 0, m.Heads), part("k", 1, m.KVHeads), part("v", 2, m.KVHeads)
}

// mlp is the layer's MLP, in the order transformers runs it:
// act(gate_proj(x)) * up_proj(x) with SiLU (Gemma: GELU, tanh
// approximation, one op); Phi-3's gate and up in one projection, chunked,
// and up * silu(gate); StarCoder2's GPT-2 MLP, c_fc, GELU, c_proj.
func (b *builder) mlp(h int) int {
	m := b.m
	var act, up int
	switch m.Family {
	case "starcoder2":
		h = b.linear("mlp.c_fc", "up", m.FFN, m.MLPBias, h)
		h = b.op("mlp.gelu", ir.GELU, ir.Attrs{}, h)
		return b.linear("mlp.c_proj", "down", m.Hidden, m.MLPBias, h)
	case "phi3":
		gu := b.linear("mlp.gate_up_proj", "gate_up", 2*m.FFN, m.MLPBias, h)
		gate := b.op("mlp.gate", ir.Split, ir.Attrs{Parts: 2, Index: 0}, gu)
		up = b.op("mlp.up", ir.Split, ir.Attrs{Parts: 2, Index: 1}, gu)
		h = b.op("mlp.mul", ir.Mul, ir.Attrs{}, up, b.op("mlp.silu", ir.SiLU, ir.Attrs{}, gate))
		return b.linear("mlp.down_proj", "down", m.Hidden, m.MLPBias, h)
	case "gemma", "gemma2":
		act = b.op("mlp.gelu", ir.GELU, ir.Attrs{}, b.linear("mlp.gate_proj", "gate", m.FFN, m.MLPBias, h))
	default:
		act = b.op("mlp.silu", ir.SiLU, ir.Attrs{}, b.linear("mlp.gate_proj", "gate", m.FFN, m.MLPBias, h))
	}
	up = b.linear("mlp.up_proj", "up", m.FFN, m.MLPBias, h)
	h = b.op("mlp.mul", ir.Mul, ir.Attrs{}, act, up)
	return b.linear("mlp.down_proj", "down", m.Hidden, m.MLPBias, h)
}

// moe is a sparse mixture of experts in place of the MLP, as
// transformers' MixtralSparseMoeBlock (and Qwen2-MoE's, Qwen 3 MoE's)
// runs it on the tokens as rows: the router's logits, their softmax in
// fp32, the top k, optionally divided by their sum, cast to the model
// dtype; each expert's rows gathered, its gated MLP, its output times
// the rows' weights, added back to the tokens. Qwen2-MoE adds a shared
// expert that every token goes through, times a sigmoid gate.
func (b *builder) moe(h int) int {
	m, t := b.m, &b.m.Training
	frozen := t.LoRA.Rank > 0
	shape := b.g.Nodes[h].Shape
	x := b.op("moe.tokens", ir.Reshape, ir.Attrs{Shape: ir.Shape{t.Batch * t.Seq, m.Hidden}}, h)
	probs := b.op("moe.softmax", ir.Softmax, ir.Attrs{Upcast: true}, b.linear("moe.gate", "router", m.Experts, false, x))
	top := b.op("moe.topk", ir.TopK, ir.Attrs{TopK: m.ExpertsPerToken}, probs)
	w := top
	if m.NormTopK {
		w = b.op("moe.norm_topk", ir.SumNorm, ir.Attrs{}, top)
	}
	w = b.cast("moe.weights_cast", b.dt, w)
	d := b.op("moe.dispatch", ir.Dispatch, ir.Attrs{Experts: m.Experts}, x, top)
	expert := func(region string, out int64, in int) int {
		return b.op("moe.experts."+region, ir.ExpertLinear, ir.Attrs{Experts: m.Experts, Out: out, Frozen: frozen}, in, d)
	}
	act := b.op("moe.experts.silu", ir.SiLU, ir.Attrs{}, expert("gate_proj", m.ExpertFFN, d))
	y := b.op("moe.experts.mul", ir.Mul, ir.Attrs{}, act, expert("up_proj", m.ExpertFFN, d))
	y = expert("down_proj", m.Hidden, y)
	y = b.op("moe.experts.weighted", ir.Mul, ir.Attrs{}, y, b.op("moe.route_weights", ir.RouteWeights, ir.Attrs{}, w, d))
	y = b.op("moe.combine", ir.Combine, ir.Attrs{TopK: m.ExpertsPerToken}, y, d)
	if m.SharedExpertFFN > 0 {
		sg := b.op("moe.shared_expert.silu", ir.SiLU, ir.Attrs{}, b.linear("moe.shared_expert.gate_proj", "shared_gate", m.SharedExpertFFN, false, x))
		s := b.op("moe.shared_expert.mul", ir.Mul, ir.Attrs{}, sg, b.linear("moe.shared_expert.up_proj", "shared_up", m.SharedExpertFFN, false, x))
		s = b.linear("moe.shared_expert.down_proj", "shared_down", m.Hidden, false, s)
		gate := b.op("moe.shared_expert_gate.sigmoid", ir.Sigmoid, ir.Attrs{}, b.linear("moe.shared_expert_gate", "router", 1, false, x))
		s = b.op("moe.shared_expert.weighted", ir.Mul, ir.Attrs{}, gate, s)
		y = b.op("moe.add_shared", ir.Add, ir.Attrs{}, y, s)
	}
	return b.op("moe.out", ir.Reshape, ir.Attrs{Shape: shape.Clone()}, y)
}

// residBranch is what a family does to a residual branch before its
// add: Phi-3's and StarCoder2's dropout, Granite's multiplier, Gemma 2's
// norm.
func (b *builder) residBranch(region string, x int) int {
	switch b.m.Family {
	case "gemma2":
		return b.norm(map[string]string{"attn": "post_attention_layernorm", "mlp": "post_feedforward_layernorm"}[region], x)
	case "phi3", "starcoder2":
		return b.dropout(region+".resid_dropout", x)
	case "granite":
		return b.op(region+".residual_multiplier", ir.Scale, ir.Attrs{Factor: b.m.ResidualMultiplier}, x)
	}
	return x
}
