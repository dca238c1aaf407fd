package costmodel

// A model holds tensors through the step that are neither weights nor
// activations: the rotary embedding's cos and sin tables, which the model
// makes in each forward and the backward's graph frees (ropeTables), and
// its registered buffers (the tables' inverse frequencies, a layer's own
// cached tables, Gemma's embedding scale from transformers 5.4), or the
// buffers measured on the live model
// (ir.Setup.BuffersBytes); and, where its sdpa layers take one (a padded
// batch, a sliding window), the mask the model makes and the attention
// saves for its backward (modelMasks).
//
// Under the transformers profile the model also makes, each forward, the
// positions (cache_position, and position_ids a view of it: seq int64s)
// and, for eager attention and sdpa's math path, the mask it adds to
// every layer's scores, and hands them to every decoder layer's call
// (learned positions are the position embedding's input instead, which
// saves them): the call arguments
// (CallArgs). No op saves them. PyTorch frees them when the model's
// forward returns, unless a checkpointed or selective layer's call holds
// them: torch.utils.checkpoint keeps its arguments for the rerun, to that
// layer's backward. They are no static memory, and Static.Total leaves
// them out; the chain holds them (solver.Chain.ArgBytes).

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Buffers are the model's non-trained tensors that live for the whole
// forward and backward: the rotary tables, the registered buffers and the
// masks sdpa layers take.
var Buffers = &Term{
	Name: "buffers",
	count: func(r *rankTally) (held, freed int64) {
		s := &r.g.Setup
		made, registered := buffers(r.g, r.held)
		held = made + registered
		if s.Profile != Megatron {
			freed = made // the forward's tables, freed with the backward's graph
		}
		masks := modelMasks(r.g, r.held, ir.Attention)
		return held + masks, freed + masks
	},
	Describe: func(_ *ir.Setup, _ Static, b mem.Bytes) string { return fmt.Sprintf("buffers %v", b) },
}

// buffers returns ropeTables' bytes, with Gemma's embedding scale among
// the registered ones where it is a buffer (ir.Attrs.Buffer); the
// registered ones as measured on the live model where they were
// (ir.Setup.BuffersBytes).
func buffers(g *ir.Graph, held func(int) bool) (made, registered int64) {
	made, registered = ropeTables(g, held)
	for i := range g.Nodes {
		if n := &g.Nodes[i]; n.Op == ir.Scale && n.Attrs.Buffer && held(i) {
			registered += g.DType.Size() // a 0-dim buffer (ir.Attrs.Buffer)
		}
	}
	if b := g.Setup.BuffersBytes; b > 0 {
		registered = b
	}
	return made, registered
}

// callArgs returns the bytes of the call arguments (see above) of a rank
// whose nodes held says: the positions, where a rotary embedding indexes
// them, and eager layers' masks. None outside the transformers profile.
// A model with learned positions (GPT-2) makes them for its position
// embedding, which saves them to its backward, the step's last: they are
// that embedding's input (a "positions" input node), held past every
// layer's backward whether or not a layer's call takes them too.
func callArgs(g *ir.Graph, held func(int) bool) int64 {
	if g.Setup.Profile != Transformers {
		return 0
	}
	var b int64
	if made, registered := ropeTables(g, held); made+registered > 0 {
		b = 8 * g.Setup.Seq
	}
	return b + modelMasks(g, held, ir.CausalMask)
}

// ropeTables returns the bytes of the rotary embedding's tensors the model
// holds through the step: made, the cos and sin tables it makes in the
// forward, one pair per distinct (sequence, head size) among the graph's
// RoPE nodes when the model makes them once (none when its layers make
// their own: their copies are the layers' activations); and registered,
// its buffers: each rotary module's inverse frequencies (head size / 2
// fp32 values), the model's one or each layer's, and a pair of tables of
// every position in each layer whose RoPE indexes a cache of its own.
func ropeTables(g *ir.Graph, held func(int) bool) (made, registered int64) {
	seen := map[[2]int64]bool{}
	layers := map[string]bool{}
	inLayer := false
	var invFreq int64
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op != ir.RoPE || !held(i) {
			continue
		}
		inLayer = inLayer || n.Attrs.Tables
		if (n.Attrs.Tables || n.Attrs.CacheLen > 0) && !layers[n.Block] {
			layers[n.Block] = true
			registered += n.Shape.Last() / 2 * 4
			if c := n.Attrs.CacheLen; c > 0 {
				registered += 2 * c * n.Shape.Last() * g.DType.Size()
			}
		}
		k := [2]int64{n.Shape[len(n.Shape)-2], n.Shape.Last()}
		if !seen[k] {
			seen[k] = true
			made += 2 * k[0] * k[1] * g.DType.Size()
			invFreq += k[1] / 2 * 4
		}
	}
	if len(layers) == 0 {
		registered += invFreq
	}
	if inLayer {
		made = 0
	}
	return made, registered
}

// modelMasks returns the bytes of the masks the model makes each forward
// and hands the layers whose op is op: its eager layers and the masked
// layers of sdpa's math path (ir.CausalMask), or its sdpa layers where
// they take one (ir.Attention: a padded batch, a sliding window;
// ir.Attrs.ModelMask), each [b, 1, s, s]:
// transformers makes one of each kind its layers take (a causal mask;
// from 4.53 a sliding-window one for sliding layers beside it), for eager
// attention materialized in the model's dtype whether or not the batch
// has padding, for sdpa from 4.53 boolean. Before 4.53 a batch without
// an attention mask gets a view of one [s, s] mask, expanded over the
// batch, and one with an attention mask a copy per sequence: counted as
// the copy, which a training batch has.
func modelMasks(g *ir.Graph, held func(int) bool, op ir.Op) int64 {
	kinds := map[string]bool{}
	var bytes int64
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Attrs.ModelMask == "" || n.Op != op || !held(i) {
			continue
		}
		var b, s, size int64
		switch {
		case n.Op == ir.CausalMask && len(n.Shape) >= 4:
			b, s, size = n.Shape[0], n.Shape.Last(), g.DType.Size()
			if g.Setup.Attention == ir.AttentionSDPAMath && g.Setup.Numerics.ModelMasks {
				size = 1 // sdpa's boolean mask, which its math path adds
			}
		case n.Op == ir.Attention:
			// q [b, heads, s, d]; boolean from 4.53.
			q := g.Nodes[n.Inputs[0]].Shape
			b, s, size = q[0], q[2], g.DType.Size()
			if g.Setup.Numerics.ModelMasks {
				size = 1
			}
		default:
			continue
		}
		// One of each kind for eager layers, one for sdpa layers.
		kind := n.Attrs.ModelMask
		if n.Op == ir.Attention {
			kind = "sdpa " + kind
		}
		if kinds[kind] {
			continue
		}
		kinds[kind] = true
		bytes += b * s * s * size
	}
	return bytes
}
