package ir

import (
	"fmt"
	"sort"
	"strings"
)

// Op is the operation a node applies to its inputs.
type Op uint8

// The ops. Their shape rules are in Infer; what each keeps for backward is
// the cost model's business, not the graph's.
const (
	OpInvalid    Op = iota
	Input           // a graph input (token ids, targets, activations)
	Embedding       // table lookup: int ids [...] -> [..., Out]; weight Vocab x Out
	Linear          // x W (+ bias): [..., in] -> [..., Out]; Frozen, LoRARank
	MatMul          // batched product [..., m, k] x [..., k, n]; TransposeB
	LayerNorm       // over the last axis, with weight and bias
	RMSNorm         // over the last axis, with weight; Upcast computes in fp32
	Softmax         // over the last axis; Upcast returns fp32
	Dropout         // P is the drop probability
	GELU            // tanh approximation
	SiLU            //
	Mul             // elementwise, broadcasting
	Add             // elementwise, broadcasting
	Scale           // multiply by the constant Factor
	CausalMask      // fill the upper triangle of the last two axes with -inf
	RoPE            // rotary position embedding on [b, heads, s, d]
	RepeatKV        // expand [b, kv, s, d] to [b, Heads, s, d]
	Cast            // change dtype to the node's DType
	Attention       // fused attention of q, k, v; Flash, Causal, P
	LogSoftmax      // over the last axis
	CrossEntropy    // mean loss of logits [..., V] against int ids [...]
	Reshape         // view with the node's shape
	Transpose       // view swapping axes Axis and Axis2
	Split           // view of part Index of Parts parts along the last axis: equal, or of the given Sizes
	Tanh            // elementwise hyperbolic tangent (Gemma 2's soft-capping)
	Sigmoid         // elementwise logistic function (a shared expert's gate)
	TopK            // the TopK largest of the last axis, in order: [..., E] -> [..., TopK]; keeps their int64 indices
	SumNorm         // divide by the sum over the last axis (renormalized routing weights)
	Dispatch        // routed token rows: x [..., h] and a topk node's choices -> [rows, h], rows grouped by expert
	ExpertLinear    // each routed row x W_e of its expert e: [rows, in] and the dispatch -> [rows, Out]; Experts weights
	RouteWeights    // each routed row's routing weight: weights [..., TopK] and the dispatch -> [rows, 1]
	Combine         // sum each token's routed rows: [rows, h] and the dispatch -> [rows/TopK, h]
	Aten            // a PyTorch op as a tracer recorded it: any inputs, its output Type, what it saves and costs given
	numOps
)

var opNames = [...]string{
	OpInvalid:    "invalid",
	Input:        "input",
	Embedding:    "embedding",
	Linear:       "linear",
	MatMul:       "matmul",
	LayerNorm:    "layernorm",
	RMSNorm:      "rmsnorm",
	Softmax:      "softmax",
	Dropout:      "dropout",
	GELU:         "gelu",
	SiLU:         "silu",
	Mul:          "mul",
	Add:          "add",
	Scale:        "scale",
	CausalMask:   "causal_mask",
	RoPE:         "rope",
	RepeatKV:     "repeat_kv",
	Cast:         "cast",
	Attention:    "attention",
	LogSoftmax:   "log_softmax",
	CrossEntropy: "cross_entropy",
	Reshape:      "reshape",
	Transpose:    "transpose",
	Split:        "split",
	Tanh:         "tanh",
	Sigmoid:      "sigmoid",
	TopK:         "topk",
	SumNorm:      "sum_norm",
	Dispatch:     "dispatch",
	ExpertLinear: "expert_linear",
	RouteWeights: "route_weights",
	Combine:      "combine",
	Aten:         "aten",
}

// String returns the op's name as written in graph YAML.
func (o Op) String() string { return indexedName(opNames[:], o, "op") }

// IsView reports whether the op only reinterprets its input's storage and
// so costs no bytes and no FLOPs.
func (o Op) IsView() bool { return o == Reshape || o == Transpose || o == Split }

// Arity returns the number of inputs the op takes; -1 for any number
// (Aten).
func (o Op) Arity() int {
	switch o {
	case Aten:
		return -1
	case Input:
		return 0
	case MatMul, Mul, Add, CrossEntropy, Dispatch, ExpertLinear, RouteWeights, Combine:
		return 2
	case Attention:
		return 3
	}
	return 1
}

// Routes reports whether input i of the op is the routing it reads (a
// topk's choices, a dispatch's rows) rather than a value it computes
// with: no gradient flows back through it.
func (o Op) Routes(i int) bool {
	switch o {
	case Dispatch, ExpertLinear, RouteWeights, Combine:
		return i == 1
	}
	return false
}

// OpNames returns the names of all ops, sorted.
func OpNames() []string {
	var names []string
	for o := Input; o < numOps; o++ {
		names = append(names, o.String())
	}
	sort.Strings(names)
	return names
}

// ParseOp parses an op name as written in graph YAML.
func ParseOp(s string) (Op, bool) {
	for o := Input; o < numOps; o++ {
		if opNames[o] == s {
			return o, true
		}
	}
	return OpInvalid, false
}

// Attrs holds the attributes of an op. Each field is meaningful only for the
// ops named in its comment; the zero value is the default for all of them.
type Attrs struct {
	Out         int64   // Linear, ExpertLinear: output features; Embedding: embedding width
	Experts     int64   // Dispatch, ExpertLinear: the experts tokens are routed to
	TopK        int64   // TopK, Combine: the experts each token is routed to
	Vocab       int64   // Embedding: rows of the table
	Bias        bool    // Linear: has a bias
	Frozen      bool    // Linear, ExpertLinear, Embedding, norms: weights are not trained
	Tied        string  // Linear, Embedding: name of the node whose weight this one shares
	LoRARank    int64   // Linear: rank of a trainable low-rank adapter (0: none)
	LoRADrop    float64 // Linear: dropout probability on the adapter's input
	Upcast      bool    // RMSNorm, LayerNorm, Softmax: compute in fp32; RoPE, CausalMask: return fp32 (fp32 tables or mask)
	Safe        bool    // Softmax: PyTorch's _safe_softmax (sdpa's math path, 2.5 on), which zeroes rows of -inf scores through a softmax made apart and masks
	OnePlus     bool    // RMSNorm: scale by 1 + weight, in fp32, and cast the product back (Gemma)
	Autocast    bool    // Linear: the weight is cast to the input's 16-bit dtype (torch.autocast)
	P           float64 // Dropout, Attention: drop probability
	Factor      float64 // Scale: the constant
	Heads       int64   // RepeatKV, Attention, RoPE: query heads
	KVHeads     int64   // Attention: key/value heads
	Flash       bool    // Attention: flash (no s^2 probabilities kept)
	BSHD        bool    // Attention: output laid out [b, s, heads, d] (PyTorch's sdpa kernels), so merging heads is a view
	TanhPy      bool    // GELU: the tanh approximation in Python ops (transformers' gelu_new), which keeps four tensors
	TensorConst bool    // Scale: the constant is a 0-dim tensor in the model dtype (GPT-2's torch.full), which the backward keeps
	Buffer      bool    // Scale with TensorConst: the constant is a registered buffer in the model's dtype, which the product keeps itself (Gemma's embedding scale, transformers 5.4 on)
	// ScalarArg: Scale's constant is the op's own Scalar argument
	// (aten.mul.Scalar, as PyTorch's kernels call it), which autograd
	// keeps inside its node; otherwise a Python number, which PyTorch
	// wraps in a host tensor that the backward keeps.
	ScalarArg bool
	Causal    bool // Attention: causal masking
	// ModelMask: CausalMask adds a mask the model makes once a forward
	// and hands every layer, [b, 1, s, s] in its dtype: transformers'
	// eager attention's, "full" or "sliding" (a sliding-window layer's,
	// from 4.53 a mask of its own); "" where the layer masks its scores
	// itself. On Attention (sdpa), the model's mask the kernel is handed:
	// from 4.53 a boolean one (a byte an element), before it one in the
	// model's dtype.
	ModelMask string
	// HeldTo: the layer's code holds the op's output in a variable of its
	// own until the node of this name has run (GPT-2's block holds its
	// attention's output to its last add), under the transformers profile.
	HeldTo     string
	MaskKept   bool    // Attention: the fused kernel is passed, and keeps, an additive mask [b, 1, s, s] in q's dtype that its layer made (Gemma 2's sliding-window layers under sdpa, and all of them under autocast)
	TransposeB bool    // MatMul: use the transpose of the last two axes of b
	Axis       int     // Transpose: first axis
	Axis2      int     // Transpose: second axis
	Parts      int     // Split: parts along the last axis
	Index      int     // Split: which part
	Sizes      Shape   // Split: the parts' sizes, when they are not equal (a fused q, k, v projection with fewer kv heads)
	Eps        float64 // LayerNorm, RMSNorm: epsilon
	Theta      float64 // RoPE: base of the rotary frequencies
	Tables     bool    // RoPE: computes the cos/sin tables it uses, [1, 1, s, d] each, which its backward keeps
	CacheLen   int64   // RoPE with Tables: they are indexed from its layer's cache of this many positions, without a product
	To         DType   // Cast: the target dtype
	Shape      Shape   // Reshape: the new shape; one entry may be -1

	// A traced op (Aten) carries what a tracer saw it do, since no rule
	// here knows it.
	Fn            string    // Aten: the PyTorch op ("aten.mm.default")
	Type          Tensor    // Aten: its output
	Extras        []Tensor  // Aten: its other outputs (a norm's statistics, a dropout's mask), each a storage of its own
	View          bool      // Aten: its output lives in a storage of input 0 (a view, or an in-place op's result)
	Interleave    bool      // RepeatKV: torch.repeat_interleave (sdpa's math path), a copy even of one head
	ViewOf        int       // Aten with View: which of input 0's storages: 0 its output's, k its k-th extra output
	Grad          bool      // Aten: its output requires a gradient
	Saves         []SaveRef // Aten: what autograd saves for its backward, in the order it saves them
	FLOPs         int64     // Aten: forward FLOPs
	BackwardFLOPs int64     // Aten: backward FLOPs
	Params        int64     // Aten: parameters it is the first op to read
	TrainParams   int64     // Aten: of those, the ones that train
	HostBytes     int64     // Aten: what it keeps for backward in host memory (a Python number it multiplies by, wrapped)
	ParamDType    DType     // Aten: the dtype those parameters are in, when not the graph's (PEFT's fp32 adapters over 16-bit weights)
}

// MaxExtras is the most extra outputs a traced op may have (PyTorch's
// CUDA flash attention returns eight besides its output).
const MaxExtras = 15

// InPlace reports whether a traced op writes its input 0 in place: a view
// whose PyTorch op is named with a trailing underscore (aten.add_.Tensor).
func (a *Attrs) InPlace() bool {
	if !a.View || a.ViewOf != 0 {
		return false
	}
	name := strings.TrimPrefix(a.Fn, "aten.")
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return strings.HasSuffix(name, "_") && !strings.HasSuffix(name, "__")
}

// IsProduct reports whether a traced op is a matrix product.
func (a *Attrs) IsProduct() bool {
	for _, p := range []string{"aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.matmul.", "aten.linear."} {
		if strings.HasPrefix(a.Fn, p) {
			return true
		}
	}
	return false
}

// SaveRef names a tensor a traced op saves: its input In, or (Output) its
// output when In is 0 and its extra output In otherwise.
type SaveRef struct {
	Output bool
	In     int
}

// String writes the reference as graph YAML does: "in0", "out", "out2".
func (r SaveRef) String() string {
	switch {
	case !r.Output:
		return fmt.Sprintf("in%d", r.In)
	case r.In == 0:
		return "out"
	}
	return fmt.Sprintf("out%d", r.In)
}

// SplitPart returns where part Index of a split of an axis of size n
// starts and how long it is.
func (a Attrs) SplitPart(n int64) (off, size int64) {
	if len(a.Sizes) > 0 {
		for _, s := range a.Sizes[:a.Index] {
			off += s
		}
		return off, a.Sizes[a.Index]
	}
	size = n / int64(a.Parts)
	return int64(a.Index) * size, size
}
