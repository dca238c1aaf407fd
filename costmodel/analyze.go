package costmodel

import (
	"fmt"
	"slices"

	"github.com/ckptplan/ckptplan/ir"
)

// Node is the cost of one graph node.
type Node struct {
	ID          int
	OutputBytes int64 // bytes of the new storage holding its output; 0 for a view
	Saved       []int // storages it keeps for backward (indexes into Costs.Storages), once per saved tensor
	SavedBytes  int64 // bytes of the activation storages first kept by this node
	// HostBytes is what it keeps for backward in host memory, apart from
	// the device's: the 0-dim float64 tensor PyTorch wraps a Python
	// scalar factor in (8 bytes, kept by the product with it), CUDA's
	// memory-efficient attention's RNG seed and offset.
	HostBytes     int64
	ForwardFLOPs  int64
	BackwardFLOPs int64
}

// Block is the cost of one block: "embed", "layers.N" or "head".
type Block struct {
	Name          string
	Nodes         []int // node IDs in graph order
	Input         int   // storage of the activation entering the block; -1 if none
	InputBytes    int64
	SavedBytes    int64 // activation bytes kept by the block's nodes, each storage once
	HostBytes     int64 // bytes the block's nodes keep in host memory (Node.HostBytes)
	ForwardFLOPs  int64
	BackwardFLOPs int64
}

// IsLayer reports whether the block is one of the repeated layers.
func (b *Block) IsLayer() bool {
	_, ok := ir.LayerIndex(b.Name)
	return ok
}

// Costs is the analysis of one graph under its training setup.
type Costs struct {
	Graph    *ir.Graph
	Profile  Profile
	Storages []Storage
	Nodes    []Node
	Blocks   []Block

	// SavedBytes is every activation kept for backward, each storage once.
	SavedBytes int64
	// SavedBytesCheckpointEveryLayer is what stays when every layer keeps
	// only its input (embedding and head store everything).
	SavedBytesCheckpointEveryLayer int64
	ForwardFLOPs                   int64
	BackwardFLOPs                  int64
	Static                         Static
	// ParamGrads says, node by node, where the backward makes the
	// parameter gradients, when they appear in it (GradientsInBackward;
	// under ZeRO stage 3, the root's alone); nil when they are held the
	// whole step and not accumulated into.
	ParamGrads []ParamGrad
	// inBackward: the gradients appear in the backward (ParamGrads says
	// where); otherwise, with ParamGrads, each backward after the first
	// of a step makes them apart and adds them in (AccumulatesGradients).
	inBackward bool
	// shards: ZeRO stage 3 makes the gradients' shards in the backward
	// (ShardsInBackward), which ParamGrads places.
	shards bool

	outputs []int   // storage of each node's output
	grad    []bool  // whether each node's output requires grad
	owned   [][]int // storages each node allocates, in index order
	reads   [][]int // storages of other nodes each node reads besides its inputs
}

// GradientsInBackward reports whether the parameter gradients appear in
// the backward (the function of that name) rather than being held the
// whole step; under ZeRO stage 3, the root's unsharded gradients, which
// it holds from the backward that makes each to the backward's end
// (Gather), and under FSDP2 the gradients' shards (ShardsInBackward).
func (c *Costs) GradientsInBackward() bool { return c.inBackward }

// AccumulatesGradients reports whether the backward of a micro-batch
// after the first makes the parameter gradients apart and adds them into
// those held (the function of that name).
func (c *Costs) AccumulatesGradients() bool { return c.ParamGrads != nil && !c.inBackward }

// HeldBytes returns the static bytes held through the whole step: all of
// Static, less the gradients when they, or their shards, appear in the
// backward.
func (c *Costs) HeldBytes() int64 {
	if GradientsInBackward(c.Graph) || c.shards {
		return c.Static.Total() - c.Static.GradientsBytes
	}
	return c.Static.Total()
}

// Reads returns the storages node id's kernel reads, forward and backward,
// that are neither its inputs' outputs nor its own: the routing a mixture
// of experts' ops share (a topk's indices, a dispatch's route). Their
// owners keep them; a forward frees them after their last reader.
func (c *Costs) Reads(id int) []int { return c.reads[id] }

// RequiresGrad reports whether node id's output needs a gradient: it
// depends on a trainable parameter.
func (c *Costs) RequiresGrad(id int) bool { return c.grad[id] }

// Owned returns the storages node id allocates (its output first when it
// has one of its own, then masks, statistics and copies), in index order.
func (c *Costs) Owned(id int) []int { return c.owned[id] }

// OwnedAs returns the storage node id allocates in a role, or -1 when it
// allocates none.
func (c *Costs) OwnedAs(id int, role Role) int {
	for _, s := range c.owned[id] {
		if c.Storages[s].Role == role {
			return s
		}
	}
	return -1
}

// OperandCopy returns the storage of the contiguous copy node id's kernel
// makes of its strided operand i, or -1 when it makes none (no op but a
// product copies, and none has more than three operands).
func (c *Costs) OperandCopy(id, i int) int {
	if i < 0 || i > int(Copy2-Copy0) {
		return -1
	}
	return c.OwnedAs(id, CopyRole(i))
}

// StorageName names a storage: the node that allocates it, and ":role"
// unless it is the node's output ("layers.0.input_layernorm:rstd").
func (c *Costs) StorageName(s int) string {
	st := &c.Storages[s]
	if st.Role == Out {
		return c.Graph.Nodes[st.Node].Name
	}
	return c.Graph.Nodes[st.Node].Name + ":" + st.Role.String()
}

// OutputStorage returns the storage holding node id's output (its own, or
// the one it is a view of).
func (c *Costs) OutputStorage(id int) int { return c.outputs[id] }

// ExtraBytes returns the bytes of the storages node id allocates besides
// its output: masks, statistics, contiguous copies.
func (c *Costs) ExtraBytes(id int) int64 {
	var b int64
	for _, k := range c.owned[id] {
		if s := &c.Storages[k]; s.Role != Out {
			b += s.Bytes
		}
	}
	return b
}

// CUDAKernels reports whether the step's kernels are PyTorch's CUDA
// ones under the transformers profile, whose rules (statistics in fp32,
// sdpa's fused kernels, the softmax backward's temporary) differ from the
// CPU's; the other profiles' rules do not depend on the device.
func (c *Costs) CUDAKernels() bool { return cudaKernels(c.Profile, &c.Graph.Setup) }

func cudaKernels(p Profile, s *ir.Setup) bool { return p == Transformers && !s.Numerics.CPUKernels }

type analyzer struct {
	g       *ir.Graph
	profile Profile
	tp      int64
	sp      bool
	lay     layout
	grad    []bool // whether each node's output requires grad
	// firstOwned is the index of the first storage each node allocates
	// (storages are appended in node order).
	firstOwned []int
	shard      []bool // whether each node's output is split over tensor-parallel ranks
	c          *Costs
	// overflow records that a count passed int64: Analyze then fails.
	overflow bool
}

// Analyze computes the costs of every node and block of g under g.Setup.
// It fails on a setup it cannot interpret (unknown profile). O(nodes).
func Analyze(g *ir.Graph) (*Costs, error) {
	setup := g.Setup
	p := setup.Profile
	if p == "" {
		p = TorchEager
	}
	if !slices.Contains(ir.Profiles(), p) {
		return nil, fmt.Errorf("unknown profile %q (valid: %s)", setup.Profile, ir.Join(ir.Profiles(), ", "))
	}
	a := &analyzer{g: g, profile: p, tp: max(setup.Parallel.TP, 1), sp: setup.Parallel.SP,
		c: &Costs{Graph: g, Profile: p}}
	n := len(g.Nodes)
	a.lay = layout{out: make([]int, n), contig: make([]bool, n)}
	a.grad = make([]bool, n)
	a.shard = make([]bool, n)
	a.firstOwned = make([]int, n)
	a.c.Nodes = make([]Node, n)
	a.c.reads = make([][]int, n)
	for i := range g.Nodes {
		a.node(&g.Nodes[i])
	}
	a.c.outputs, a.c.grad = a.lay.out, a.grad
	a.c.owned = make([][]int, n)
	for k, st := range a.c.Storages {
		a.c.owned[st.Node] = append(a.c.owned[st.Node], k)
	}
	a.count()
	a.blocks()
	if a.overflow {
		return nil, fmt.Errorf("%s: its FLOPs or bytes pass 2^63 (about 9.2e18): the model, batch or sequence is %w", g.Name, ir.ErrTooLarge)
	}
	st, err := staticMemory(g)
	if err != nil {
		return nil, err
	}
	st.add(Buffers, a.heldInputs())
	a.c.Static = st
	shards := ShardsInBackward(g) && st.GradientsBytes > 0
	// FSDP2 reduce-scatters a layer's gradients in every micro-batch's
	// backward too, adding each into the shard the step holds.
	accumulates := fsdp2Accumulates(g) && st.GradientsBytes > 0
	switch {
	case st.GradientsBytes > 0 && (GradientsInBackward(g) || AccumulatesGradients(g)):
		a.c.ParamGrads = paramGrads(g)
		a.c.inBackward = GradientsInBackward(g)
	case st.Gather.DeepSpeed != nil:
		// DeepSpeed's hooks copy each gradient into its bucket as
		// autograd makes it (Gather.DeepSpeed counts them there).
	case shards || accumulates || st.Gather.RootGrads > 0 && !g.Setup.Parallel.NoSync:
		// ZeRO stage 3 holds the root's gradients unsharded from the
		// backward that makes each to the backward's end (Gather). Where
		// it makes the shards in the backward (FSDP2), a layer's are
		// counted where its nodes' backwards run, the root's when the
		// backward ends; a layer's unsharded gradients beyond them are
		// held to the layer's reduce-scatter, and so they are where
		// FSDP2 adds them into the shards the step holds.
		a.c.ParamGrads = paramGrads(g)
		a.c.shards = shards
		layers := int64(0)
		for i := range g.Nodes {
			if _, ok := ir.LayerIndex(g.Nodes[i].Block); ok {
				pg := ParamGrad{}
				if shards {
					dp := max(g.Setup.Parallel.DP, 1)
					whole := a.c.ParamGrads[i]
					pg = ParamGrad{Keep: ceilDiv(whole.Keep, dp), Apart: ceilDiv(whole.Apart, dp)}
					pg.Unsharded = whole.Keep - pg.Keep
					layers += pg.Keep
				}
				if accumulates {
					pg.Unsharded = a.c.ParamGrads[i].Keep
				}
				a.c.ParamGrads[i] = pg
			}
		}
		if shards {
			a.c.Static.Gather.RootShard = max(st.GradientsBytes-layers, 0)
		}
		a.c.Static.Gather.FSDP2 = shards || accumulates
		a.c.inBackward = true
	}
	return a.c, nil
}

// BoundGathers counts what ZeRO stage 3 gathers while a layer runs by its
// bounds (Gather.ForwardBytes, BackwardBytes), which hold a layer's
// unsharded gradients too, instead of at FSDP2's moments, which
// Gather.Layer places by the layer's place in the whole model: for a
// pipeline's devices, each running some of the layers.
func (c *Costs) BoundGathers() {
	if !c.Static.Gather.FSDP2 {
		return
	}
	c.Static.Gather.FSDP2 = false
	for i := range c.ParamGrads {
		c.ParamGrads[i].Unsharded = 0
	}
}

// heldInputs returns the bytes of the floating-point graph inputs traced
// ops keep: what the model computes once and hands every layer (rotary
// cos and sin), which lives through the step as its tables do.
func (a *analyzer) heldInputs() int64 {
	var b int64
	seen := map[int]bool{}
	for id := range a.c.Nodes {
		if a.g.Nodes[id].Op != ir.Aten {
			continue
		}
		for _, s := range a.c.Nodes[id].Saved {
			st := &a.c.Storages[s]
			if !seen[s] && a.g.Nodes[st.Node].Op == ir.Input && st.DType.IsFloat() {
				seen[s] = true
				b += st.Bytes
			}
		}
	}
	return b
}

func (a *analyzer) node(n *ir.Node) {
	g := a.g
	c := &a.c.Nodes[n.ID]
	c.ID = n.ID
	for i, in := range n.Inputs {
		a.grad[n.ID] = a.grad[n.ID] || a.grad[in] && !n.Op.Routes(i)
	}
	if g.TrainableParams(n.ID) > 0 {
		a.grad[n.ID] = true
	}
	if n.Op == ir.Aten {
		a.grad[n.ID] = n.Attrs.Grad // as the tracer saw it
	}
	a.shard[n.ID] = a.sharded(n)
	a.firstOwned[n.ID] = len(a.c.Storages)
	inContig := len(n.Inputs) == 0 || a.lay.contig[n.Inputs[0]]
	if n.Op == ir.Aten && n.Attrs.View && n.Attrs.ViewOf > 0 {
		// One of a traced op's other outputs, as a node of its own.
		a.lay.out[n.ID] = a.made(n.Inputs[0], ExtraRole(n.Attrs.ViewOf))
		a.lay.contig[n.ID] = true
	} else if view, contig := viewOf(g, n, inContig); view && n.Op != ir.Input {
		a.lay.out[n.ID] = a.lay.out[n.Inputs[0]]
		a.lay.contig[n.ID] = contig
	} else {
		a.lay.out[n.ID] = a.extra(n, Out, n.Shape, n.DType, a.shard[n.ID])
		a.lay.contig[n.ID] = true
		c.OutputBytes = a.c.Storages[a.lay.out[n.ID]].Bytes
	}
	// The rules run for every node: they also create the buffers the
	// kernel writes (masks, statistics, copies), which a node whose output
	// needs no gradient allocates and frees as transients.
	a.copyOperands(n)
	a.keeps(n)
	c.ForwardFLOPs, c.BackwardFLOPs = a.flops(n)
}

// sharded says whether a node's output is split over tensor-parallel ranks,
// following Megatron's layout: a linear of a replicated input is column
// parallel (its output is split), a linear of a split input is row parallel
// (its output is all-reduced, replicated); other ops split what they read.
func (a *analyzer) sharded(n *ir.Node) bool {
	if a.tp == 1 {
		return false
	}
	switch n.Op {
	case ir.Input, ir.Embedding:
		return false
	case ir.Linear:
		return !a.shard[n.Inputs[0]]
	}
	for _, in := range n.Inputs {
		if a.shard[in] {
			return true
		}
	}
	return false
}

// extra allocates a new storage owned by n and returns its index.
func (a *analyzer) extra(n *ir.Node, role Role, shape ir.Shape, dt ir.DType, sharded bool) int {
	dt = a.countedDType(dt)
	b, _ := shape.Bytes(dt)
	if a.tp > 1 && (sharded || a.sp) {
		b = (b + a.tp - 1) / a.tp
	}
	a.c.Storages = append(a.c.Storages, Storage{Node: n.ID, Role: role, Shape: shape.Clone(), DType: dt, Bytes: b, Sharded: sharded})
	return len(a.c.Storages) - 1
}

// countedDType is the dtype a profile counts a tensor in: Megatron's fused
// kernels keep every floating-point activation in the 16-bit model dtype.
func (a *analyzer) countedDType(dt ir.DType) ir.DType {
	if a.profile == Megatron && dt.IsFloat() {
		return a.g.DType
	}
	return dt
}

// keep records that n keeps a storage, once per saved tensor as autograd
// records them (an op may keep one storage twice).
func (a *analyzer) keep(n *ir.Node, storage int) {
	if !a.grad[n.ID] {
		return // no backward: nothing is kept
	}
	c := &a.c.Nodes[n.ID]
	c.Saved = append(c.Saved, storage)
}

// keepHost records that node n keeps bytes in host memory for its
// backward, when it has one.
func (a *analyzer) keepHost(n *ir.Node, bytes int64) {
	if a.grad[n.ID] {
		a.c.Nodes[n.ID].HostBytes += bytes
	}
}

// WrappedScalarBytes is what PyTorch keeps for a product with a Python
// number: the number wrapped in a 0-dim float64 tensor, in host memory
// whatever the device.
const WrappedScalarBytes = 8

// CheckpointHostBytes is what torch.utils.checkpoint stashes in host
// memory for each checkpointed or selective layer under the transformers
// profile's runtime, to replay its random numbers: the CPU generator's
// state (5,056 bytes) and, on CUDA, the device generator's seed and
// offset (16 bytes).
func CheckpointHostBytes(c *Costs) int64 {
	if c.Profile != Transformers {
		return 0
	}
	if c.Graph.Setup.Numerics.CPUKernels {
		return 5056
	}
	return 5056 + 16
}

// count attributes each kept activation storage to the first node that
// keeps it, in graph order.
func (a *analyzer) count() {
	counted := make([]bool, len(a.c.Storages))
	for i := range a.c.Nodes {
		c := &a.c.Nodes[i]
		for _, s := range c.Saved {
			st := &a.c.Storages[s]
			if counted[s] || !st.IsActivation(a.g) {
				continue
			}
			counted[s] = true
			c.SavedBytes = a.add(c.SavedBytes, st.Bytes)
		}
		a.c.SavedBytes = a.add(a.c.SavedBytes, c.SavedBytes)
		a.c.ForwardFLOPs = a.add(a.c.ForwardFLOPs, c.ForwardFLOPs)
		a.c.BackwardFLOPs = a.add(a.c.BackwardFLOPs, c.BackwardFLOPs)
	}
}

func (a *analyzer) blocks() {
	g := a.g
	index := map[string]int{}
	for _, name := range g.Blocks() {
		index[name] = len(a.c.Blocks)
		a.c.Blocks = append(a.c.Blocks, Block{Name: name, Input: -1})
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Block == "" {
			continue
		}
		b := &a.c.Blocks[index[n.Block]]
		b.Nodes = append(b.Nodes, i)
		c := &a.c.Nodes[i]
		b.SavedBytes += c.SavedBytes
		b.HostBytes += c.HostBytes
		b.ForwardFLOPs += c.ForwardFLOPs
		b.BackwardFLOPs += c.BackwardFLOPs
		for _, in := range n.Inputs {
			src := &g.Nodes[in]
			if b.Input < 0 && src.Block != n.Block && src.DType.IsFloat() && src.Op != ir.Input {
				b.Input = a.lay.out[in]
				b.InputBytes = a.c.Storages[b.Input].Bytes
			}
		}
	}
	a.checkpointEveryLayer()
}

// checkpointEveryLayer totals the activations kept when every layer is
// checkpointed: each layer's input, and everything the other blocks keep.
func (a *analyzer) checkpointEveryLayer() {
	counted := map[int]bool{}
	add := func(s int) {
		if !counted[s] && a.c.Storages[s].IsActivation(a.g) {
			counted[s] = true
			a.c.SavedBytesCheckpointEveryLayer += a.c.Storages[s].Bytes
		}
	}
	for _, b := range a.c.Blocks {
		if b.IsLayer() {
			if b.Input >= 0 {
				add(b.Input)
			}
			continue
		}
		for _, id := range b.Nodes {
			for _, s := range a.c.Nodes[id].Saved {
				add(s)
			}
		}
	}
}
