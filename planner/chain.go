package planner

import (
	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/solver"
)

// StageCosts is what the planner knows of one stage of a model or graph,
// in exact integers.
type StageCosts struct {
	Name              string
	ForwardFLOPs      int64
	BackwardFLOPs     int64
	InputBytes        int64 // a_i
	TapeBytes         int64 // what F_all keeps: saved activations but a_i, and a_{i+1}
	ForwardTempBytes  int64
	BackwardTempBytes int64
	Nodes             []int
}

// stageCosts turns a cut graph into per-stage costs. a_0 is the bytes of
// the graph's inputs; a_i the storage entering stage i; a_L the output.
func stageCosts(c *costmodel.Costs, stages []stage) ([]StageCosts, int64) {
	g := c.Graph
	stageOf := make([]int, len(g.Nodes))
	for i := range stageOf {
		stageOf[i] = -1
	}
	for k, st := range stages {
		for _, id := range st.nodes {
			stageOf[id] = k
		}
	}
	storageOf := storageOwners(c)
	var inputs int64
	for i := range g.Nodes {
		if g.Nodes[i].Op == ir.Input {
			inputs += g.Nodes[i].Bytes()
		}
	}
	out := make([]StageCosts, len(stages))
	for k, st := range stages {
		sc := &out[k]
		sc.Name, sc.Nodes = st.name, st.nodes
		in := stageInput(c, stageOf, k, st)
		if in >= 0 {
			sc.InputBytes = c.Storages[in].Bytes
		} else if k == 0 {
			sc.InputBytes = inputs
		}
		last := st.nodes[len(st.nodes)-1]
		outStorage := storageOf[last]
		seen := map[int]bool{}
		for _, id := range st.nodes {
			sc.ForwardFLOPs += c.Nodes[id].ForwardFLOPs
			sc.BackwardFLOPs += c.Nodes[id].BackwardFLOPs
			for _, s := range c.Nodes[id].Saved {
				if seen[s] || s == in || !c.Storages[s].IsActivation(g) {
					continue
				}
				seen[s] = true
				sc.TapeBytes += c.Storages[s].Bytes
			}
		}
		if !seen[outStorage] {
			sc.TapeBytes += c.Storages[outStorage].Bytes
		}
		sc.ForwardTempBytes, sc.BackwardTempBytes = transients(c, st, in, outStorage, seen)
	}
	return out, inputs
}

// storageOwners returns, for every node, the storage its output lives in.
func storageOwners(c *costmodel.Costs) []int {
	out := make([]int, len(c.Graph.Nodes))
	for i := range out {
		out[i] = c.OutputStorage(i)
	}
	return out
}

// stageInput returns the storage of the activation entering stage k from
// an earlier stage, or -1 when only graph inputs enter it.
func stageInput(c *costmodel.Costs, stageOf []int, k int, st stage) int {
	g := c.Graph
	for _, id := range st.nodes {
		for _, in := range g.Nodes[id].Inputs {
			if s := stageOf[in]; s >= 0 && s < k {
				return c.OutputStorage(in)
			}
		}
	}
	return -1
}

// transients returns the bytes a stage holds beyond its input, its output
// and (for F_all) its tape while it runs forward, and beyond its tape,
// its input and δ_{i+1} while it runs backward. Forward: every new output
// lives from its op until its last consumer in the stage has run, and an
// op's extra buffers (masks, statistics, copies) live during the op; the
// larger of the storing and the non-storing forward is taken. Backward:
// the gradient of every intermediate lives from the backward of its last
// consumer to its own, and δ_i is allocated at the start.
func transients(c *costmodel.Costs, st stage, in, out int, tape map[int]bool) (fwd, bwd int64) {
	g := c.Graph
	pos := map[int]int{}
	for k, id := range st.nodes {
		pos[id] = k
	}
	lastUse := make([]int, len(st.nodes))
	for k := range st.nodes {
		lastUse[k] = k
	}
	for k, id := range st.nodes {
		for _, src := range g.Nodes[id].Inputs {
			if p, ok := pos[src]; ok {
				lastUse[p] = max(lastUse[p], k)
			}
		}
	}
	own := func(k int) int64 { // bytes of the new storage of node k's output
		s := c.OutputStorage(st.nodes[k])
		if c.Storages[s].Node != st.nodes[k] || s == out {
			return 0
		}
		return c.Storages[s].Bytes
	}
	for _, keep := range []bool{false, true} {
		var live, peak int64
		for k, id := range st.nodes {
			extra := c.ExtraBytes(id)
			peak = max(peak, live+own(k)+extra)
			live += own(k)
			for p := 0; p <= k; p++ {
				if lastUse[p] == k && !(keep && tape[c.OutputStorage(st.nodes[p])]) {
					live -= own(p)
				}
			}
		}
		fwd = max(fwd, peak)
	}
	grad := func(k int) int64 { // bytes of the gradient of node k's output
		n := &g.Nodes[st.nodes[k]]
		if n.Op.IsView() || !n.DType.IsFloat() || st.nodes[k] == st.nodes[len(st.nodes)-1] {
			return 0
		}
		return n.Bytes()
	}
	var delta int64
	if in >= 0 {
		delta = c.Storages[in].Bytes
	}
	var live, peak int64
	held := make([]bool, len(st.nodes))
	for k := len(st.nodes) - 1; k >= 0; k-- {
		for _, src := range g.Nodes[st.nodes[k]].Inputs {
			if p, ok := pos[src]; ok && !held[p] {
				held[p] = true
				live += grad(p)
			}
		}
		peak = max(peak, live)
		if held[k] {
			live -= grad(k)
		}
	}
	return fwd, peak + delta
}

// toSolver converts stage costs to a solver chain: costs in FLOPs, the
// last stage's output a_L as the loss input.
func toSolver(stages []StageCosts, inputBytes, outputBytes int64) *solver.Chain {
	ch := &solver.Chain{}
	for k, s := range stages {
		a := s.InputBytes
		if k == 0 {
			a = inputBytes
		}
		ch.ActBytes = append(ch.ActBytes, a)
		ch.Forward = append(ch.Forward, float64(s.ForwardFLOPs))
		ch.Backward = append(ch.Backward, float64(s.BackwardFLOPs))
		ch.TapeBytes = append(ch.TapeBytes, s.TapeBytes)
		ch.ForwardTempBytes = append(ch.ForwardTempBytes, s.ForwardTempBytes)
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, s.BackwardTempBytes)
	}
	ch.ActBytes = append(ch.ActBytes, outputBytes)
	return ch
}
