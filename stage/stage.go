package stage

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// Stage is one stage of a chain cut from a costed graph: its nodes, the
// activations entering and leaving it, its costs, the transients of its
// programs, and the keep sets its storing forward may run.
type Stage struct {
	Index int
	Name  string
	Nodes []int // graph order
	// Input is the storage of a_i when an earlier stage makes it, -1 when
	// only graph inputs enter the stage.
	Input      int
	Output     int       // the storage of a_{i+1}
	InputBytes mem.Bytes // a_i: the graph inputs' bytes for the first stage
	// Saved are the storages a keep set chooses among: the activations
	// the stage's nodes allocate and its ops save for backward, a_{i+1}
	// aside, in allocation order.
	Saved         []int
	ForwardFLOPs  int64
	BackwardFLOPs int64
	// TapeBytes is what a storing forward that keeps everything keeps:
	// the saved storages (and any other activation the stage's ops save,
	// a_i aside) and a_{i+1}.
	TapeBytes mem.Bytes
	// HostBytes is what the stage's ops keep in host memory for backward
	// whether it stores, checkpoints or keeps part (costmodel.Node.HostBytes).
	HostBytes        mem.Bytes
	ForwardTempBytes mem.Bytes // beyond a_{i+1}, during a forward that keeps no tape
	FAllTempBytes    mem.Bytes // beyond the tape, during a storing forward that keeps everything
	// FAllInputFreedTempBytes is FAllTempBytes where the forward frees its
	// input after its last reader (StoringProgramFreeingInput): an
	// unsaved activation (solver.Chain.UnsavedActs). Less than
	// FAllTempBytes, by up to InputBytes.
	FAllInputFreedTempBytes mem.Bytes
	BackwardTempBytes       mem.Bytes // during the backward after keeping everything, δ_i included
	// GradBytes are the parameter gradients the backward makes and keeps
	// to the optimizer step (costmodel.Costs.GradientsInBackward; 0
	// otherwise), counted in its transients at their moment.
	GradBytes mem.Bytes
	// KeepSets are the ways the storing forward may run; KeepSets[0]
	// keeps everything (TapeBytes and the transients above). Build gives
	// only that one; SearchKeepSets gives them all.
	KeepSets []KeepSet
	// FrontTooWide says that the stage has too many ways to recompute for
	// its Pareto front to be searched: its keep sets are the named
	// policies alone.
	FrontTooWide bool
	// Routed says that the stage routes tokens to experts: which rows each
	// expert's tensors have is data, known when the step runs, so no keep
	// set can name them ahead. The stage is stored or recomputed whole:
	// its only keep set keeps everything.
	Routed bool

	c *costmodel.Costs
	// final says the stage is the chain's last: its output is the loss,
	// whose gradient the training loop holds to the backward's end
	// (solver.Chain.HoldsLoss), so its backward does not hand it on.
	final bool
	tape  []int // every storage keeping everything keeps, sorted
	// release says, node by node, the tape storages whose last reader
	// its backward is: autograd frees a node's saved tensors once its
	// backward has run, and a storage with them when no other node still
	// saves it.
	release map[int][]int
	index   map[int]int // saved storage → its index in Saved
	prefix  string      // the nodes' common dotted name prefix, left out of tensor names
	// argEnds and lastRead are moduleArgEnds' and lastReads'.
	argEnds, lastRead map[int]int
}

// Build cuts a costed graph into stages, at its blocks when byBlock (a
// model) and at its cut points otherwise, and computes each stage's costs
// and transients; each stage's only keep set is keep-all until
// SearchKeepSets. O(nodes).
func Build(c *costmodel.Costs, byBlock bool) ([]*Stage, error) {
	g := c.Graph
	var spans []span
	if byBlock {
		spans = blockSpans(g)
	} else {
		var err error
		if spans, err = graphSpans(g); err != nil {
			return nil, err
		}
	}
	if len(spans) > ir.MaxStages {
		return nil, fmt.Errorf("cut into %d stages, more than the %d ckptplan plans", len(spans), ir.MaxStages)
	}
	stageOf := make([]int, len(g.Nodes))
	for i := range stageOf {
		stageOf[i] = -1
	}
	for k, sp := range spans {
		for _, id := range sp.nodes {
			stageOf[id] = k
		}
	}
	var inputs mem.Bytes
	for i := range g.Nodes {
		if g.Nodes[i].Op == ir.Input {
			inputs += mem.Bytes(g.Nodes[i].Bytes())
		}
	}
	out := make([]*Stage, len(spans))
	for k, sp := range spans {
		in, err := stageInput(c, stageOf, spans, k)
		if err != nil {
			return nil, err
		}
		st := newStage(c, k, sp, in, inputs, k == len(spans)-1)
		st.KeepSets = []KeepSet{st.keepAll()}
		out[k] = st
	}
	return out, nil
}

// SearchKeepSets gives every stage all its keep sets (KeepSets), the named
// policies and the exact front; Build gives only keep-all. Identical
// stages (every layer of a model) share one search.
func SearchKeepSets(c *costmodel.Costs, stages []*Stage) {
	mods := costmodel.FindModules(c.Graph)
	cache := map[string]*searched{}
	for _, st := range stages {
		st.KeepSets = st.keepSets(mods, cache)
	}
}

// newStage computes a stage's tape, costs and keep-everything transients;
// inputs is the bytes of the graph inputs, a_0; final says the stage is
// the chain's last.
func newStage(c *costmodel.Costs, k int, sp span, in int, inputs mem.Bytes, final bool) *Stage {
	g := c.Graph
	last := sp.nodes[len(sp.nodes)-1]
	st := &Stage{Index: k, Name: sp.name, Nodes: sp.nodes, Input: in, Output: c.OutputStorage(last), final: final, c: c, index: map[int]int{}}
	if in >= 0 {
		st.InputBytes = mem.Bytes(c.Storages[in].Bytes)
	} else if k == 0 {
		st.InputBytes = inputs
	}
	inTape := map[int]bool{st.Output: true}
	for _, id := range sp.nodes {
		st.Routed = st.Routed || g.Nodes[id].Op == ir.Dispatch
		st.ForwardFLOPs += c.Nodes[id].ForwardFLOPs
		st.BackwardFLOPs += c.Nodes[id].BackwardFLOPs
		st.HostBytes += mem.Bytes(c.Nodes[id].HostBytes)
		for _, s := range c.Nodes[id].Saved {
			if s != in && c.Storages[s].IsActivation(g) {
				inTape[s] = true
			}
		}
	}
	for s := range inTape {
		st.tape = append(st.tape, s)
		st.TapeBytes += mem.Bytes(c.Storages[s].Bytes)
	}
	slices.Sort(st.tape)
	st.release = map[int][]int{}
	for _, s := range st.tape {
		// The backward runs in reverse: the first node in graph order
		// that saves s reads it last.
		for _, id := range sp.nodes {
			if slices.Contains(c.Nodes[id].Saved, s) {
				st.release[id] = append(st.release[id], s)
				break
			}
		}
	}
	for _, id := range sp.nodes {
		for _, s := range c.Owned(id) {
			if inTape[s] && s != st.Output {
				st.index[s] = len(st.Saved)
				st.Saved = append(st.Saved, s)
			}
		}
	}
	st.prefix = commonPrefix(g, sp.nodes)
	st.argEnds = st.moduleArgEnds()
	st.lastRead = st.lastReads()
	all := st.keepAll()
	st.ForwardTempBytes = st.ForwardProgram().Peak() - st.OutputBytes()
	st.FAllTempBytes = st.StoringProgram(&all).Peak() - st.TapeBytes
	st.FAllInputFreedTempBytes = st.FAllTempBytes
	if p := st.StoringProgramFreeingInput(&all); p != nil {
		st.FAllInputFreedTempBytes = p.Peak() - st.TapeBytes
	}
	st.GradBytes = st.paramGradBytes()
	st.BackwardTempBytes = st.BackwardProgram().Peak()
	return st
}

// stageInput returns the storage of the activation entering stage k from
// an earlier stage, or -1 when only graph inputs enter it. A chain has
// one: the previous stage's output. Any other is an error, for the stage
// would need a tensor the chain does not carry.
func stageInput(c *costmodel.Costs, stageOf []int, spans []span, k int) (int, error) {
	g := c.Graph
	sp := spans[k]
	in := -1
	if k > 0 {
		prev := spans[k-1].nodes
		in = c.OutputStorage(prev[len(prev)-1])
	}
	found := false
	for _, id := range sp.nodes {
		for _, x := range g.Nodes[id].Inputs {
			s := stageOf[x]
			if s < 0 || s >= k {
				continue
			}
			got := c.OutputStorage(x)
			if got != in {
				return 0, fmt.Errorf("%s reads %s, made in %s: a block may read only the previous block's output and the graph's inputs",
					g.Nodes[id].Name, g.Nodes[x].Name, spans[s].name)
			}
			found = true
		}
	}
	if !found {
		return -1, nil
	}
	return in, nil
}

// commonPrefix returns the longest dotted prefix ("layers.3.") all the
// nodes' names share, so that tensors are named alike in every layer.
func commonPrefix(g *ir.Graph, nodes []int) string {
	parts := strings.Split(g.Nodes[nodes[0]].Name, ".")
	for k := len(parts) - 1; k > 0; k-- {
		p := strings.Join(parts[:k], ".") + "."
		if !slices.ContainsFunc(nodes, func(id int) bool { return !strings.HasPrefix(g.Nodes[id].Name, p) }) {
			return p
		}
	}
	return ""
}

// OutputBytes returns the bytes of a_{i+1}.
func (st *Stage) OutputBytes() mem.Bytes { return mem.Bytes(st.c.Storages[st.Output].Bytes) }

// Costs returns the cost model the stage was cut from.
func (st *Stage) Costs() *costmodel.Costs { return st.c }

// Tape returns every storage a storing forward that keeps everything
// keeps, a_{i+1} included, in storage order; the backward frees them:
// those an op of the stage saves once the last of them has run its
// backward, the others when the stage's backward ends.
func (st *Stage) Tape() []int { return st.tape }

// TensorName returns the name of a storage in the vocabulary of the
// model, relative to the stage: its node's name without the stage's
// common prefix ("mlp.up_proj" in every layer), and ":role" unless it is
// the node's output ("input_layernorm:rstd").
func (st *Stage) TensorName(s int) string {
	return strings.TrimPrefix(st.c.StorageName(s), st.prefix)
}

// Holds reports whether a storing forward under keep set k keeps storage
// s until the backward: a_{i+1}, a kept saved storage, a storage the keep
// set's runtime caches although no op saves it (KeepSet.Held), or any
// other tape storage (one the stage's nodes do not allocate).
func (st *Stage) Holds(k *KeepSet, s int) bool {
	if j, ok := st.index[s]; ok {
		return k.Keeps(j)
	}
	if _, ok := slices.BinarySearch(k.held, s); ok {
		return true
	}
	return st.inTape(s)
}

// Saves reports whether one of the stage's ops saves storage s for
// backward.
func (st *Stage) Saves(s int) bool {
	for _, id := range st.Nodes {
		if slices.Contains(st.c.Nodes[id].Saved, s) {
			return true
		}
	}
	return false
}

// SavedOrder returns the activation storages the stage's own nodes
// allocate and its ops save for backward, a_{i+1} included when an op
// saves it, in the order they are first saved: the order in which
// autograd packs them.
func (st *Stage) SavedOrder() []int {
	c := st.c
	own := map[int]bool{}
	for _, id := range st.Nodes {
		own[id] = true
	}
	seen := map[int]bool{}
	var out []int
	for _, id := range st.Nodes {
		for _, s := range c.Nodes[id].Saved {
			if !seen[s] && own[c.Storages[s].Node] && c.Storages[s].IsActivation(c.Graph) {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}
