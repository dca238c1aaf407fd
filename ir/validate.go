package ir

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"gonum.org/v1/gonum/graph"
	"gonum.org/v1/gonum/graph/simple"
	"gonum.org/v1/gonum/graph/topo"
)

// MaxNamed is the most node names an error lists.
const MaxNamed = 10

// MaxStages is the most stages ckptplan plans from its inputs (a chain
// file, a graph's cut points, a model's layers): beyond it, the optimal
// solver's table's O(S·L³) work and the baselines' O(L³) take longer than
// anyone waits (800 stages at the default slots: 20–40 s). The solver
// itself takes chains of any length; the readers refuse longer inputs
// where they can name the line.
const MaxStages = 800

// CycleError reports nodes that depend on themselves through their inputs.
type CycleError struct {
	Nodes []string // the nodes on cycles, sorted, at most MaxNamed
	Total int      // how many nodes are on cycles
}

func (e *CycleError) Error() string {
	s := "cycle through " + strings.Join(e.Nodes, ", ")
	if e.Total > len(e.Nodes) {
		s += fmt.Sprintf(" and %d more", e.Total-len(e.Nodes))
	}
	return s
}

// TopoOrder returns the node IDs of g in a topological order, inputs first,
// breaking ties by ID so that the order is deterministic. Nodes on cycles are
// reported as a *CycleError. Dangling input IDs are an error.
func TopoOrder(nodes []Node) ([]int, error) {
	dg := simple.NewDirectedGraph()
	for i := range nodes {
		dg.AddNode(simple.Node(i))
	}
	for i, n := range nodes {
		for _, in := range n.Inputs {
			if in < 0 || in >= len(nodes) {
				return nil, fmt.Errorf("node %s: input %d does not exist", n.Name, in)
			}
			if in == i {
				return nil, &CycleError{Nodes: []string{n.Name}, Total: 1}
			}
			dg.SetEdge(dg.NewEdge(simple.Node(in), simple.Node(i)))
		}
	}
	// topo.SortStabilized breaks ties with the given function: by ID.
	sorted, err := topo.SortStabilized(dg, func(ns []graph.Node) {
		sort.Slice(ns, func(a, b int) bool { return ns[a].ID() < ns[b].ID() })
	})
	var unorderable topo.Unorderable
	if errors.As(err, &unorderable) {
		var names []string
		for _, scc := range unorderable {
			for _, n := range scc {
				names = append(names, nodes[n.ID()].Name)
			}
		}
		sort.Strings(names)
		e := &CycleError{Total: len(names)}
		e.Nodes = names[:min(len(names), MaxNamed)]
		return nil, e
	}
	if err != nil {
		return nil, err
	}
	order := make([]int, len(sorted))
	for i, n := range sorted {
		order[i] = int(n.ID())
	}
	return order, nil
}

// Validate checks that g is well formed: names are unique, every input
// exists and precedes its consumer, there are no cycles, every output type
// is what Infer says, no tensor's bytes overflow int64, and Output names a
// node. It returns the first problem found.
func Validate(g *Graph) error {
	if !inOrder(g.Nodes) {
		// Name the missing input or the cycle; a graph that is acyclic but
		// out of order is refused below, at its first late input.
		if _, err := TopoOrder(g.Nodes); err != nil {
			return err
		}
	}
	seen := make(map[string]bool, len(g.Nodes))
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.ID != i {
			return fmt.Errorf("node %s: ID %d at index %d", n.Name, n.ID, i)
		}
		if seen[n.Name] {
			return fmt.Errorf("node name %q is used twice", n.Name)
		}
		seen[n.Name] = true
		if err := validateNode(g, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if g.Output < 0 || g.Output >= len(g.Nodes) {
		return fmt.Errorf("graph %s has no output", g.Name)
	}
	return nil
}

// inOrder reports whether every input of every node exists and precedes it,
// which makes the graph acyclic without a sort.
func inOrder(nodes []Node) bool {
	for i := range nodes {
		for _, in := range nodes[i].Inputs {
			if in < 0 || in >= i {
				return false
			}
		}
	}
	return true
}

func validateNode(g *Graph, n *Node) error {
	if _, ok := n.Shape.Bytes(n.DType); !ok || n.DType == Invalid {
		return fmt.Errorf("output %v of %v is empty or overflows int64 bytes", n.Shape, n.DType)
	}
	if n.Op == Input {
		return nil
	}
	in := make([]Tensor, len(n.Inputs))
	for j, id := range n.Inputs {
		if id >= n.ID {
			return fmt.Errorf("input %s comes after the node", g.Nodes[id].Name)
		}
		in[j] = g.Nodes[id].Tensor()
	}
	t, err := Infer(n.Op, n.Attrs, in, g.DType)
	if err != nil {
		return err
	}
	if err := validateRouting(g, n); err != nil {
		return err
	}
	if err := validateTraced(g, n); err != nil {
		return err
	}
	if !t.Shape.Equal(n.Shape) || t.DType != n.DType {
		return fmt.Errorf("output is %v %v, but its inputs give %v %v", n.Shape, n.DType, t.Shape, t.DType)
	}
	return nil
}

// validateTraced checks that a traced op's references hold: its extra
// outputs have a size, a view names a storage its input 0 has, and what it
// saves is one of its inputs or outputs.
func validateTraced(g *Graph, n *Node) error {
	a := &n.Attrs
	if n.Op != Aten {
		return nil
	}
	if a.Fn == "" {
		return fmt.Errorf("a traced op needs the PyTorch op it ran (fn)")
	}
	if len(a.Extras) > MaxExtras {
		return fmt.Errorf("%d extra outputs, more than the %d a traced op may have", len(a.Extras), MaxExtras)
	}
	for k, x := range a.Extras {
		if _, ok := x.Shape.Bytes(x.DType); (!ok && !x.Shape.HasZero()) || x.DType == Invalid {
			return fmt.Errorf("output %d is %v of %v: empty or too large", k+1, x.Shape, x.DType)
		}
	}
	if a.View {
		if len(n.Inputs) == 0 {
			return fmt.Errorf("a view needs an input whose storage it lives in")
		}
		if src := &g.Nodes[n.Inputs[0]]; a.ViewOf < 0 || a.ViewOf > len(src.Attrs.Extras) || a.ViewOf > 0 && src.Op != Aten {
			return fmt.Errorf("a view of output %d of %s, which has no such output", a.ViewOf, src.Name)
		}
	}
	if a.FLOPs < 0 || a.BackwardFLOPs < 0 || a.Params < 0 || a.TrainParams < 0 || a.TrainParams > a.Params {
		return fmt.Errorf("negative FLOPs or parameters, or more trained parameters than parameters")
	}
	if a.ParamDType != Invalid && (!a.ParamDType.IsFloat() || a.Params == 0) {
		return fmt.Errorf("parameters in %v: a floating-point dtype for parameters it has", a.ParamDType)
	}
	for _, r := range a.Saves {
		if r.In < 0 || !r.Output && r.In >= len(n.Inputs) || r.Output && r.In > len(a.Extras) {
			return fmt.Errorf("saves %v, which it does not have", r)
		}
	}
	return nil
}

// validateRouting checks that the routed ops read what they route by: a
// dispatch the choices of a topk over its experts, the others a dispatch
// (whose k they agree with).
func validateRouting(g *Graph, n *Node) error {
	switch n.Op {
	case Dispatch:
		t := &g.Nodes[n.Inputs[1]]
		if t.Op != TopK {
			return fmt.Errorf("dispatch routes by a topk's choices, but %s is a %v", t.Name, t.Op)
		}
		if e := g.Nodes[t.Inputs[0]].Shape.Last(); e != n.Attrs.Experts {
			return fmt.Errorf("dispatch over %d experts routes by %s, a choice among %d", n.Attrs.Experts, t.Name, e)
		}
	case ExpertLinear, RouteWeights, Combine:
		d := &g.Nodes[n.Inputs[1]]
		if d.Op != Dispatch {
			return fmt.Errorf("%v reads its routing from a dispatch, but %s is a %v", n.Op, d.Name, d.Op)
		}
		k := g.Nodes[d.Inputs[1]].Shape.Last()
		switch {
		case n.Op == ExpertLinear && n.Attrs.Experts != d.Attrs.Experts:
			return fmt.Errorf("expert_linear of %d experts reads %s, which routes to %d", n.Attrs.Experts, d.Name, d.Attrs.Experts)
		case n.Op == Combine && n.Attrs.TopK != k:
			return fmt.Errorf("combine of %d rows per token reads %s, which routes %d", n.Attrs.TopK, d.Name, k)
		case n.Op == RouteWeights && g.Nodes[n.Inputs[0]].Shape.Last() != k:
			return fmt.Errorf("route_weights of %v reads %s, which routes %d per token", g.Nodes[n.Inputs[0]].Shape, d.Name, k)
		}
	}
	return nil
}
