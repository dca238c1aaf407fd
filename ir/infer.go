package ir

import "fmt"

// Tensor is the type of a node's output: its shape and element type.
type Tensor struct {
	Shape Shape
	DType DType
}

// Infer returns the output of op applied to inputs, or an error that says
// what does not fit. model is the dtype of the model's weights, which is
// the output dtype of an Embedding. Input nodes have no rule: their type is
// given.
func Infer(op Op, a Attrs, in []Tensor, model DType) (Tensor, error) {
	if op == Input || op == OpInvalid || op >= numOps {
		return Tensor{}, fmt.Errorf("op %v has no shape rule", op)
	}
	if op == Aten {
		// A traced op's output is what the tracer saw.
		return Tensor{a.Type.Shape.Clone(), a.Type.DType}, nil
	}
	if len(in) != op.Arity() {
		return Tensor{}, fmt.Errorf("%v takes %d inputs, got %d", op, op.Arity(), len(in))
	}
	x := in[0]
	same := Tensor{x.Shape.Clone(), x.DType}
	needFloat := func() error {
		if !x.DType.IsFloat() {
			return fmt.Errorf("%v needs a floating-point input, got %v", op, x.DType)
		}
		return nil
	}
	switch op {
	case Embedding:
		if x.DType != Int64 {
			return Tensor{}, fmt.Errorf("embedding needs int64 ids, got %v", x.DType)
		}
		if a.Vocab <= 0 || a.Out <= 0 {
			return Tensor{}, fmt.Errorf("embedding needs a positive vocab and width, got %d and %d", a.Vocab, a.Out)
		}
		if _, ok := (Shape{a.Vocab, a.Out}).Bytes(FP64); !ok {
			return Tensor{}, fmt.Errorf("an embedding table of %d×%d is too large to count", a.Vocab, a.Out)
		}
		return Tensor{append(x.Shape.Clone(), a.Out), model}, nil
	case Linear:
		if len(x.Shape) == 0 {
			return Tensor{}, fmt.Errorf("linear needs an input with at least one axis")
		}
		if a.Out <= 0 {
			return Tensor{}, fmt.Errorf("linear needs a positive output width, got %d", a.Out)
		}
		if a.LoRARank < 0 {
			return Tensor{}, fmt.Errorf("negative LoRA rank %d", a.LoRARank)
		}
		if in := x.Shape.Last(); a.LoRARank > min(in, a.Out) {
			return Tensor{}, fmt.Errorf("LoRA rank %d is larger than the layer it adapts (%d in, %d out): a low-rank adapter has rank at most %d", a.LoRARank, in, a.Out, min(in, a.Out))
		}
		if _, ok := (Shape{x.Shape.Last(), a.Out}).Bytes(FP64); !ok {
			return Tensor{}, fmt.Errorf("a weight of %d×%d is too large to count", x.Shape.Last(), a.Out)
		}
		s := x.Shape.Clone()
		s[len(s)-1] = a.Out
		return Tensor{s, x.DType}, needFloat()
	case MatMul:
		return inferMatMul(a, x, in[1])
	case LayerNorm, RMSNorm, GELU, SiLU, Tanh, Sigmoid, SumNorm, Scale, Dropout, LogSoftmax:
		if op == Dropout && (a.P < 0 || a.P >= 1) {
			return Tensor{}, fmt.Errorf("dropout probability %v is not in [0, 1)", a.P)
		}
		return same, needFloat()
	case Softmax:
		if a.Upcast {
			same.DType = FP32
		}
		return same, needFloat()
	case Mul, Add:
		s, err := Broadcast(x.Shape, in[1].Shape)
		if err != nil {
			return Tensor{}, fmt.Errorf("%v: %w", op, err)
		}
		dt := x.DType
		if x.DType != in[1].DType {
			// Floating-point operands promote to the wider, as PyTorch's do.
			if !x.DType.IsFloat() || !in[1].DType.IsFloat() {
				return Tensor{}, fmt.Errorf("%v of %v and %v: dtypes differ", op, x.DType, in[1].DType)
			}
			if in[1].DType.Size() > dt.Size() {
				dt = in[1].DType
			}
		}
		return Tensor{s, dt}, needFloat()
	case CausalMask:
		if len(x.Shape) < 2 {
			return Tensor{}, fmt.Errorf("causal_mask needs at least two axes, got %v", x.Shape)
		}
		if a.Upcast {
			same.DType = FP32
		}
		return same, needFloat()
	case RoPE:
		if len(x.Shape) < 2 || x.Shape.Last()%2 != 0 {
			return Tensor{}, fmt.Errorf("rope needs [..., s, d] with an even d, got %v", x.Shape)
		}
		if a.Upcast {
			same.DType = FP32
		}
		return same, needFloat()
	case RepeatKV:
		if len(x.Shape) != 4 || a.Heads <= 0 || a.Heads%x.Shape[1] != 0 {
			return Tensor{}, fmt.Errorf("repeat_kv needs [b, kv, s, d] with kv dividing %d heads, got %v", a.Heads, x.Shape)
		}
		s := x.Shape.Clone()
		s[1] = a.Heads
		return Tensor{s, x.DType}, nil
	case Cast:
		if a.To == Invalid {
			return Tensor{}, fmt.Errorf("cast needs a target dtype")
		}
		same.DType = a.To
		return same, nil
	case Attention:
		return inferAttention(a, in)
	case TopK, Dispatch, ExpertLinear, RouteWeights, Combine:
		return inferRouting(op, a, in)
	case CrossEntropy:
		t := in[1]
		if t.DType != Int64 {
			return Tensor{}, fmt.Errorf("cross_entropy needs int64 targets, got %v", t.DType)
		}
		if len(x.Shape) != len(t.Shape)+1 || !x.Shape[:len(t.Shape)].Equal(t.Shape) {
			return Tensor{}, fmt.Errorf("cross_entropy of logits %v against targets %v: want logits [..., V] over targets [...]", x.Shape, t.Shape)
		}
		return Tensor{Shape{}, x.DType}, needFloat()
	case Reshape:
		return inferReshape(a, x)
	case Transpose:
		n := len(x.Shape)
		i, j := a.Axis, a.Axis2
		if i < 0 {
			i += n
		}
		if j < 0 {
			j += n
		}
		if i < 0 || i >= n || j < 0 || j >= n {
			return Tensor{}, fmt.Errorf("transpose axes %d and %d out of range for %v", a.Axis, a.Axis2, x.Shape)
		}
		same.Shape[i], same.Shape[j] = same.Shape[j], same.Shape[i]
		return same, nil
	case Split:
		if a.Parts <= 0 || a.Index < 0 || a.Index >= a.Parts {
			return Tensor{}, fmt.Errorf("split part %d of %d is out of range", a.Index, a.Parts)
		}
		if len(x.Shape) == 0 {
			return Tensor{}, fmt.Errorf("split: a scalar has no axis to split")
		}
		if len(a.Sizes) > 0 {
			sum := int64(0)
			for _, n := range a.Sizes {
				if n <= 0 || n > x.Shape.Last()-sum {
					return Tensor{}, fmt.Errorf("split: sizes %v do not cut the last axis of %v", a.Sizes, x.Shape)
				}
				sum += n
			}
			if len(a.Sizes) != a.Parts {
				return Tensor{}, fmt.Errorf("split: %d sizes %v for %d parts", len(a.Sizes), a.Sizes, a.Parts)
			}
			if sum != x.Shape.Last() {
				return Tensor{}, fmt.Errorf("split: sizes %v do not cut the last axis of %v", a.Sizes, x.Shape)
			}
		} else if x.Shape.Last()%int64(a.Parts) != 0 {
			return Tensor{}, fmt.Errorf("split: last axis of %v is not divisible into %d parts", x.Shape, a.Parts)
		}
		_, same.Shape[len(same.Shape)-1] = a.SplitPart(x.Shape.Last())
		return same, nil
	}
	return Tensor{}, fmt.Errorf("op %v has no shape rule", op)
}

func inferMatMul(a Attrs, x, y Tensor) (Tensor, error) {
	if len(x.Shape) < 2 || len(y.Shape) < 2 {
		return Tensor{}, fmt.Errorf("matmul needs at least two axes on each side, got %v and %v", x.Shape, y.Shape)
	}
	if x.DType != y.DType {
		return Tensor{}, fmt.Errorf("matmul of %v and %v: dtypes differ", x.DType, y.DType)
	}
	m, k := x.Shape[len(x.Shape)-2], x.Shape[len(x.Shape)-1]
	k2, n := y.Shape[len(y.Shape)-2], y.Shape[len(y.Shape)-1]
	if a.TransposeB {
		k2, n = n, k2
	}
	if k != k2 {
		return Tensor{}, fmt.Errorf("matmul of %v and %v (transpose_b %v): inner sizes %d and %d differ", x.Shape, y.Shape, a.TransposeB, k, k2)
	}
	batch, err := Broadcast(x.Shape[:len(x.Shape)-2], y.Shape[:len(y.Shape)-2])
	if err != nil {
		return Tensor{}, fmt.Errorf("matmul batch axes: %w", err)
	}
	return Tensor{append(batch, m, n), x.DType}, nil
}

func inferAttention(a Attrs, in []Tensor) (Tensor, error) {
	q, k, v := in[0].Shape, in[1].Shape, in[2].Shape
	if len(q) != 4 || len(k) != 4 || len(v) != 4 {
		return Tensor{}, fmt.Errorf("attention needs q, k, v as [b, heads, s, d], got %v, %v, %v", q, k, v)
	}
	if !k.Equal(v) || q[0] != k[0] || q[3] != k[3] {
		return Tensor{}, fmt.Errorf("attention: q %v, k %v and v %v do not agree", q, k, v)
	}
	if q[1]%k[1] != 0 {
		return Tensor{}, fmt.Errorf("attention: %d key/value heads do not divide %d query heads", k[1], q[1])
	}
	if a.P < 0 || a.P >= 1 {
		return Tensor{}, fmt.Errorf("attention dropout %v is not in [0, 1)", a.P)
	}
	return Tensor{q.Clone(), in[0].DType}, nil
}

func inferReshape(a Attrs, x Tensor) (Tensor, error) {
	n := x.Shape.NumElements()
	s := a.Shape.Clone()
	free := -1
	prod := int64(1)
	for i, d := range s {
		switch {
		case d == -1 && free < 0:
			free = i
		case d <= 0:
			return Tensor{}, fmt.Errorf("reshape to %v: sizes must be positive (one may be -1)", a.Shape)
		default:
			p, ok := Shape{prod, d}.Elements()
			if !ok {
				return Tensor{}, fmt.Errorf("reshape to %v overflows", a.Shape)
			}
			prod = p
		}
	}
	if free >= 0 {
		if n%prod != 0 {
			return Tensor{}, fmt.Errorf("cannot reshape %v to %v", x.Shape, a.Shape)
		}
		s[free] = n / prod
		prod = n
	}
	if prod != n {
		return Tensor{}, fmt.Errorf("cannot reshape %v (%d elements) to %v", x.Shape, n, a.Shape)
	}
	return Tensor{s, x.DType}, nil
}

// inferRouting is the shape rule of the mixture-of-experts ops: a top-k
// router's choices over the last axis, and the routed rows they make.
// The ops that read the routing take the dispatch (or, for the dispatch,
// the topk) as their second input; Validate checks those are what they
// read.
func inferRouting(op Op, a Attrs, in []Tensor) (Tensor, error) {
	x := in[0]
	if !x.DType.IsFloat() {
		return Tensor{}, fmt.Errorf("%v needs a floating-point input, got %v", op, x.DType)
	}
	if len(x.Shape) == 0 {
		return Tensor{}, fmt.Errorf("%v needs an input with at least one axis", op)
	}
	rows := func() (int64, error) {
		r := in[1].Shape
		if len(r) != 2 {
			return 0, fmt.Errorf("%v: the dispatch is %v, want [rows, h]", op, r)
		}
		return r[0], nil
	}
	switch op {
	case TopK:
		if a.TopK <= 0 || a.TopK > x.Shape.Last() {
			return Tensor{}, fmt.Errorf("topk of %d out of a last axis of %d", a.TopK, x.Shape.Last())
		}
		s := x.Shape.Clone()
		s[len(s)-1] = a.TopK
		return Tensor{s, x.DType}, nil
	case Dispatch:
		t := in[1].Shape
		if a.Experts <= 0 {
			return Tensor{}, fmt.Errorf("dispatch needs a positive number of experts, got %d", a.Experts)
		}
		if len(t) != len(x.Shape) || !t[:len(t)-1].Equal(x.Shape[:len(x.Shape)-1]) {
			return Tensor{}, fmt.Errorf("dispatch of %v by choices %v: the tokens differ", x.Shape, t)
		}
		return Tensor{Shape{t.NumElements(), x.Shape.Last()}, x.DType}, nil
	case ExpertLinear:
		r, err := rows()
		if err != nil {
			return Tensor{}, err
		}
		if len(x.Shape) != 2 || x.Shape[0] != r {
			return Tensor{}, fmt.Errorf("expert_linear of %v: want the dispatch's %d rows", x.Shape, r)
		}
		if a.Experts <= 0 || a.Out <= 0 {
			return Tensor{}, fmt.Errorf("expert_linear needs positive experts and output width, got %d and %d", a.Experts, a.Out)
		}
		if _, ok := (Shape{a.Experts, x.Shape.Last(), a.Out}).Bytes(FP64); !ok {
			return Tensor{}, fmt.Errorf("%d expert weights of %d×%d are too large to count", a.Experts, x.Shape.Last(), a.Out)
		}
		return Tensor{Shape{r, a.Out}, x.DType}, nil
	case RouteWeights:
		r, err := rows()
		if err != nil {
			return Tensor{}, err
		}
		if x.Shape.NumElements() != r {
			return Tensor{}, fmt.Errorf("route_weights of %v for %d routed rows", x.Shape, r)
		}
		return Tensor{Shape{r, 1}, x.DType}, nil
	default: // Combine
		r, err := rows()
		if err != nil {
			return Tensor{}, err
		}
		if len(x.Shape) != 2 || x.Shape[0] != r || a.TopK <= 0 || r%a.TopK != 0 {
			return Tensor{}, fmt.Errorf("combine of %v: want the dispatch's %d rows, %d per token", x.Shape, r, a.TopK)
		}
		return Tensor{Shape{r / a.TopK, x.Shape.Last()}, x.DType}, nil
	}
}
