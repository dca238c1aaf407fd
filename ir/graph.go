package ir

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// LayerIndex returns N for a block named "layers.N", the name the model
// builders and the tracer give the N-th decoder layer.
func LayerIndex(block string) (int, bool) {
	s, ok := strings.CutPrefix(block, "layers.")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == s
}

// Node is one op application. Its ID is its index in Graph.Nodes.
type Node struct {
	ID     int
	Name   string // unique in the graph, e.g. "layers.3.attn.q_proj"
	Op     Op
	Inputs []int // IDs of the input nodes, in the op's argument order
	Shape  Shape // output shape
	DType  DType // output dtype
	Attrs  Attrs
	Block  string // "embed", "layers.N", "head", or "" for graph inputs
}

// Tensor returns the node's output type.
func (n *Node) Tensor() Tensor { return Tensor{n.Shape, n.DType} }

// Bytes returns the bytes of the node's output.
func (n *Node) Bytes() int64 {
	b, _ := n.Shape.Bytes(n.DType)
	return b
}

// Graph is a training computation graph. Nodes are in a topological order
// (inputs first) once the graph is valid; Output is the node whose value the
// backward pass starts from (the loss for a model).
type Graph struct {
	Name   string
	DType  DType // dtype of the weights and activations
	Nodes  []Node
	Output int
	Setup  Setup // how the graph is trained

	byName map[string]int
}

// NewGraph returns an empty graph.
func NewGraph(name string, dt DType) *Graph {
	return &Graph{Name: name, DType: dt, Output: -1, byName: map[string]int{}}
}

// Lookup returns the ID of the named node.
func (g *Graph) Lookup(name string) (int, bool) {
	if g.byName == nil {
		g.byName = map[string]int{}
		for i := range g.Nodes {
			g.byName[g.Nodes[i].Name] = i
		}
	}
	id, ok := g.byName[name]
	return id, ok
}

// Grow makes room for n more nodes, so that a builder that knows how many
// it will add (a layer's, times the layers) appends them without copying
// the graph as it grows.
func (g *Graph) Grow(n int) {
	if n <= 0 {
		return
	}
	g.Nodes = slices.Grow(g.Nodes, n)
	byName := make(map[string]int, len(g.Nodes)+n)
	for i := range g.Nodes {
		byName[g.Nodes[i].Name] = i
	}
	g.byName = byName
}

// AddInput appends a graph input of the given type and returns its ID.
func (g *Graph) AddInput(name, block string, t Tensor) (int, error) {
	if _, ok := t.Shape.Bytes(t.DType); !ok {
		return -1, fmt.Errorf("input %s: shape %v of %v is empty or too large", name, t.Shape, t.DType)
	}
	return g.append(Node{Name: name, Op: Input, Shape: t.Shape, DType: t.DType, Block: block})
}

// AddOp appends a node applying op to the given inputs, infers its output
// type, and returns its ID. It fails if a name repeats, an input is unknown
// or the shapes do not fit the op.
func (g *Graph) AddOp(name, block string, op Op, a Attrs, inputs ...int) (int, error) {
	in := make([]Tensor, len(inputs))
	for i, id := range inputs {
		if id < 0 || id >= len(g.Nodes) {
			return -1, fmt.Errorf("node %s: input %d does not exist", name, id)
		}
		in[i] = g.Nodes[id].Tensor()
	}
	t, err := Infer(op, a, in, g.DType)
	if err != nil {
		return -1, fmt.Errorf("node %s: %w", name, err)
	}
	if _, ok := t.Shape.Bytes(t.DType); !ok {
		return -1, fmt.Errorf("node %s: output %v of %v overflows int64 bytes", name, t.Shape, t.DType)
	}
	return g.append(Node{Name: name, Op: op, Inputs: inputs, Shape: t.Shape, DType: t.DType, Attrs: a, Block: block})
}

func (g *Graph) append(n Node) (int, error) {
	if _, dup := g.Lookup(n.Name); dup {
		return -1, fmt.Errorf("node name %q is used twice", n.Name)
	}
	n.ID = len(g.Nodes)
	g.Nodes = append(g.Nodes, n)
	g.byName[n.Name] = n.ID
	return n.ID, nil
}

// Blocks returns the block names in the order their first node appears.
func (g *Graph) Blocks() []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range g.Nodes {
		if n.Block != "" && !seen[n.Block] {
			seen[n.Block] = true
			out = append(out, n.Block)
		}
	}
	return out
}

// Consumers returns, for every node, the IDs of the nodes that read it, in
// increasing order.
func (g *Graph) Consumers() [][]int {
	out := make([][]int, len(g.Nodes))
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in >= 0 && in < len(out) {
				out[in] = append(out[in], n.ID)
			}
		}
	}
	return out
}

// Params returns the number of parameters of a node's own weights: linear
// weights, biases and LoRA adapters, embedding tables, norm scales and
// shifts. A node whose weight is tied to another's has none of its own.
func (g *Graph) Params(id int) int64 {
	n := &g.Nodes[id]
	if n.Attrs.Tied != "" {
		return 0
	}
	switch n.Op {
	case Aten:
		return n.Attrs.Params
	case Embedding:
		return n.Attrs.Vocab * n.Attrs.Out
	case Linear:
		in := g.Nodes[n.Inputs[0]].Shape.Last()
		p := in * n.Attrs.Out
		if n.Attrs.Bias {
			p += n.Attrs.Out
		}
		return p + n.Attrs.LoRARank*(in+n.Attrs.Out)
	case ExpertLinear:
		return n.Attrs.Experts * g.Nodes[n.Inputs[0]].Shape.Last() * n.Attrs.Out
	case LayerNorm:
		return 2 * n.Shape.Last()
	case RMSNorm:
		return n.Shape.Last()
	}
	return 0
}

// TrainableParams returns the parameters of a node that receive gradients:
// all of them, except the frozen base weight of a linear, embedding or norm
// (a LoRA adapter on a frozen linear still trains).
func (g *Graph) TrainableParams(id int) int64 {
	n := &g.Nodes[id]
	if n.Op == Aten {
		return n.Attrs.TrainParams
	}
	if !n.Attrs.Frozen {
		return g.Params(id)
	}
	if n.Op == Linear && n.Attrs.Tied == "" {
		in := g.Nodes[n.Inputs[0]].Shape.Last()
		return n.Attrs.LoRARank * (in + n.Attrs.Out)
	}
	return 0
}

// NumParams returns the total parameter count of the graph.
func (g *Graph) NumParams() int64 {
	var p int64
	for i := range g.Nodes {
		p += g.Params(i)
	}
	return p
}
