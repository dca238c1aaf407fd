package stage

// Cutting a graph into stages. A model is cut at its blocks: the
// embedding, each layer, the head with the loss, in graph order. An
// explicit graph has no blocks to trust, so it is cut after each of its
// cut points: the nodes every path from the inputs to the output passes
// through, where one tensor carries everything the rest of the graph
// needs. They are the dominators of the output in the graph with a
// virtual source joined to every input (Lengauer–Tarjan, O(E·α(E)), via
// gonum's flow.Dominators).

import (
	"fmt"
	"slices"

	"github.com/ckptplan/ckptplan/ir"
	"gonum.org/v1/gonum/graph/flow"
	"gonum.org/v1/gonum/graph/simple"
)

// span is a contiguous run of graph nodes between two cuts.
type span struct {
	name  string
	nodes []int // graph order
}

// blockSpans cuts a model at its blocks.
func blockSpans(g *ir.Graph) []span {
	index := map[string]int{}
	var out []span
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op == ir.Input {
			continue
		}
		k, ok := index[n.Block]
		if !ok {
			k = len(out)
			index[n.Block] = k
			out = append(out, span{name: n.Block})
		}
		out[k].nodes = append(out[k].nodes, i)
	}
	return out
}

// CutPoints returns the nodes every path from the graph's inputs to its
// output passes through, in graph order, the output included.
func CutPoints(g *ir.Graph) []int {
	dg := simple.NewDirectedGraph()
	src := int64(len(g.Nodes))
	dg.AddNode(simple.Node(src))
	for i := range g.Nodes {
		dg.AddNode(simple.Node(i))
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op == ir.Input {
			dg.SetEdge(dg.NewEdge(simple.Node(src), simple.Node(i)))
		}
		for _, in := range n.Inputs {
			dg.SetEdge(dg.NewEdge(simple.Node(in), simple.Node(i)))
		}
	}
	tree := flow.Dominators(simple.Node(src), dg)
	var cuts []int
	for v := tree.DominatorOf(int64(g.Output)); v != nil && v.ID() != src; v = tree.DominatorOf(v.ID()) {
		if g.Nodes[v.ID()].Op != ir.Input {
			cuts = append(cuts, int(v.ID()))
		}
	}
	// cuts runs from the output backwards.
	slices.Reverse(cuts)
	return append(cuts, g.Output)
}

// graphSpans cuts an explicit graph after each cut point. Nodes listed
// after the output cannot reach it and are left out.
func graphSpans(g *ir.Graph) ([]span, error) {
	cuts := CutPoints(g)
	isCut := make([]bool, len(g.Nodes))
	for _, c := range cuts {
		isCut[c] = true
	}
	var out []span
	cur := span{}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op == ir.Input || i > g.Output && len(out) == len(cuts) {
			continue
		}
		cur.nodes = append(cur.nodes, i)
		if isCut[i] {
			cur.name = n.Name
			out = append(out, cur)
			cur = span{}
		}
	}
	if len(cur.nodes) > 0 {
		if len(out) == 0 {
			return nil, fmt.Errorf("graph %s: output is not reached", g.Name)
		}
		last := &out[len(out)-1]
		last.nodes = append(last.nodes, cur.nodes...)
	}
	return out, nil
}
