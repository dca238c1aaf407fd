package costmodel

import "github.com/ckptplan/ckptplan/ir"

// Storage is a buffer allocated by one node: its output, or something else
// the op materializes (a dropout mask, normalization statistics, a
// contiguous copy of an operand).
type Storage struct {
	Node    int      // the node that allocates it
	Role    Role     // what it holds for its node
	Shape   ir.Shape // logical shape (before any sharding)
	DType   ir.DType // as the profile counts it
	Bytes   int64    // bytes on one rank, after tensor/sequence parallel sharding
	Sharded bool     // split across tensor-parallel ranks
}

// IsActivation reports whether a storage counts as an activation: a
// tensor computed in the step (a floating-point output, or anything an op
// materializes for its backward, such as a 1-byte dropout mask). Graph
// inputs (token ids, targets) and scalars are not activations; every
// storage a traced op makes is.
func (s *Storage) IsActivation(g *ir.Graph) bool {
	if n := &g.Nodes[s.Node]; n.Op == ir.Aten {
		return true // whatever a traced op made and saved is memory the step holds
	}
	return len(s.Shape) > 0 && g.Nodes[s.Node].Op != ir.Input && (s.DType.IsFloat() || s.Role != Out)
}

// layout tracks, while walking the graph, which storage each node's output
// lives in and whether that view is contiguous.
type layout struct {
	out    []int  // storage of each node's output
	contig []bool // whether each node's output is contiguous in its storage
}

// viewOf returns whether op with this input yields a view of the input's
// storage (no new buffer) and whether the view is contiguous.
func viewOf(g *ir.Graph, n *ir.Node, inContig bool) (view, contig bool) {
	switch n.Op {
	case ir.Aten:
		return n.Attrs.View && n.Attrs.ViewOf == 0, true
	case ir.Reshape:
		// A reshape of a non-contiguous tensor copies (torch.reshape),
		// unless the strides allow a view: a part of a split, whose last
		// axis is dense, viewed with only that axis split (GPT-2's heads).
		if !inContig && g.Nodes[n.Inputs[0]].Op == ir.Split && splitsLastAxis(g.Nodes[n.Inputs[0]].Shape, n.Shape) {
			return true, false
		}
		return inContig, true
	case ir.Transpose:
		// sdpa's output is a [b, heads, s, d] view of a [b, s, heads, d]
		// buffer: swapping heads and s back makes it contiguous.
		in := &g.Nodes[n.Inputs[0]]
		if in.Op == ir.Attention && in.Attrs.BSHD && min(n.Attrs.Axis, n.Attrs.Axis2) == 1 && max(n.Attrs.Axis, n.Attrs.Axis2) == 2 {
			return true, true
		}
		return true, n.Attrs.Axis == n.Attrs.Axis2
	case ir.Split:
		return true, n.Attrs.Parts == 1
	case ir.Cast:
		return n.Attrs.To == g.Nodes[n.Inputs[0]].DType, inContig
	case ir.RepeatKV:
		// expand + reshape stays a view when there is one kv head, at any
		// batch: the size-1 head axis merges with the stride-0 repeat
		// axis. Otherwise the reshape copies.
		if g.Nodes[n.Inputs[0]].Shape[1] == 1 && !n.Attrs.Interleave {
			return true, false
		}
	}
	return false, true
}

// splitsLastAxis reports whether reshaping in to out only splits in's last
// axis: every other axis is kept.
func splitsLastAxis(in, out ir.Shape) bool {
	k := len(in) - 1
	if k < 0 || len(out) < len(in) {
		return false
	}
	for i := 0; i < k; i++ {
		if in[i] != out[i] {
			return false
		}
	}
	p := int64(1)
	for _, d := range out[k:] {
		p *= d
	}
	return p == in[k]
}
