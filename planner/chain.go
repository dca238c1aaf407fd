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
	ForwardTempBytes  int64 // beyond the output, during F_ck and F_n
	FAllTempBytes     int64 // beyond the tape, during F_all
	BackwardTempBytes int64
	Nodes             []int
	Tape              map[int]bool // the storages F_all keeps, the output included
	// Options are the keep sets a storing forward may use; Options[0] is
	// keep-all (Tape, TapeBytes and the temps above).
	Options []KeepSet
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
	core := costmodel.AttentionCore(g)
	cache := map[string][]namedFlags{}
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
		seen[outStorage] = true
		sc.Tape = seen
		outBytes := c.Storages[outStorage].Bytes
		sc.ForwardTempBytes = ForwardProgram(c, st.nodes, false, seen).Peak() - outBytes
		sc.FAllTempBytes = ForwardProgram(c, st.nodes, true, seen).Peak() - sc.TapeBytes
		delta := sc.InputBytes
		sc.BackwardTempBytes = BackwardProgram(c, st.nodes, delta).Peak()
		sc.Options = keepSets(c, sc, in, core, cache)
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
		ch.FAllTempBytes = append(ch.FAllTempBytes, s.FAllTempBytes)
		ch.BackwardTempBytes = append(ch.BackwardTempBytes, s.BackwardTempBytes)
		var opts []solver.Option
		for _, o := range s.Options[min(1, len(s.Options)):] {
			opts = append(opts, solver.Option{TapeBytes: o.TapeBytes, FAllTempBytes: o.FAllTempBytes,
				Backward: float64(s.BackwardFLOPs + o.ExtraFLOPs), BackwardTempBytes: o.BackwardTempBytes})
		}
		ch.Options = append(ch.Options, opts)
	}
	ch.ActBytes = append(ch.ActBytes, outputBytes)
	return ch
}
