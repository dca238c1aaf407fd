package costmodel

// Megatron-LM's selective recomputation works on modules, not tensors:
// --recompute-modules names the parts of every transformer layer whose
// forward runs without keeping its insides, and whose backward reruns the
// whole part first (Megatron Core's TransformerLayer, 0.12). Three of its
// modules are parts of the layers ckptplan builds:
//
//   - core_attn, the attention core: QKᵀ through softmax and dropout, and
//     the product with V (DotProductAttention, checkpointed whole; see
//     AttentionCore for what it drops);
//   - layernorm, the layer's two pre-norms (input_layernorm and
//     pre_mlp_layernorm), whose outputs CheckpointWithoutOutput frees once
//     their consumer has run and restores before its backward;
//   - mlp, the dense MLP from its input projection through its output
//     projection, checkpointed whole from its input (a layer routing to
//     experts has no dense MLP).
//
// The modules are found by structure, per layer block: a pre-norm is a
// norm that reads the layer's input or a residual sum; the MLP is every
// node on a path from the last pre-norm's output to the last linear layer
// fed by it. O(nodes + edges).

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
)

// Module is one of Megatron-LM's recompute modules, a bit each; a set of
// them is their union.
type Module uint8

// The modules, in the order Megatron-LM's --recompute-modules lists them.
const (
	CoreAttn  Module = 1 << iota // "core_attn": the attention core
	LayerNorm                    // "layernorm": the two pre-norms
	MLP                          // "mlp": the dense MLP
	// AllModules is every module ckptplan models.
	AllModules = CoreAttn | LayerNorm | MLP
)

var moduleNames = []string{"core_attn", "layernorm", "mlp"}

// unmodelled are Megatron-LM's other recompute modules (0.12), parts of
// layers ckptplan does not build.
var unmodelled = []string{"moe_act", "mla_up_proj", "moe"}

// Names returns the modules' names as Megatron-LM spells them, in its
// order.
func (m Module) Names() []string {
	var out []string
	for i, name := range moduleNames {
		if m&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return out
}

// String is the modules' names, separated by spaces, as the flag takes
// them.
func (m Module) String() string { return strings.Join(m.Names(), " ") }

// ParseModule returns the module named as Megatron-LM names it, or an
// error saying why the name is not one ckptplan models.
func ParseModule(name string) (Module, error) {
	if i := slices.Index(moduleNames, name); i >= 0 {
		return 1 << i, nil
	}
	if slices.Contains(unmodelled, name) {
		return 0, fmt.Errorf("%s is a module of Megatron-LM's that ckptplan does not model (it models %s)", name, strings.Join(moduleNames, ", "))
	}
	return 0, fmt.Errorf("unknown module %q (valid: %s)", name, strings.Join(moduleNames, ", "))
}

// ModuleNames lists the names ParseModule takes.
func ModuleNames() []string { return append([]string(nil), moduleNames...) }

// ModuleMap is where Megatron-LM's modules lie in a graph.
type ModuleMap struct {
	of     []Module // per node, the module it belongs to (0 for none)
	core   []bool   // AttentionCore
	mlpOut []bool   // per node, whether it is an MLP's output projection
}

// FindModules returns the modules of g's layers.
func FindModules(g *ir.Graph) *ModuleMap {
	m := &ModuleMap{of: make([]Module, len(g.Nodes)), core: AttentionCore(g), mlpOut: make([]bool, len(g.Nodes))}
	for id := range g.Nodes {
		n := &g.Nodes[id]
		switch {
		case m.core[id]:
			m.of[id] = CoreAttn
		case n.Op == ir.MatMul && slices.ContainsFunc(n.Inputs, func(in int) bool { return in >= 0 && m.core[in] }):
			m.of[id] = CoreAttn // the product with V
		}
	}
	consumers := g.Consumers()
	var order []string
	blocks := map[string][]int{}
	routed := map[string]bool{}
	for id := range g.Nodes {
		b := g.Nodes[id].Block
		if _, ok := ir.LayerIndex(b); !ok {
			continue
		}
		if _, seen := blocks[b]; !seen {
			order = append(order, b)
		}
		blocks[b] = append(blocks[b], id)
		routed[b] = routed[b] || g.Nodes[id].Op == ir.Dispatch
	}
	for _, b := range order {
		nodes := blocks[b] // in graph order, inputs first
		norm := -1         // the last pre-norm
		for _, id := range nodes {
			if preNorm(g, id) {
				m.of[id] |= LayerNorm
				norm = id
			}
		}
		if norm < 0 || routed[b] {
			continue
		}
		// Forward from the norm, then back from the last linear it feeds.
		from := map[int]bool{norm: true}
		proj := -1
		for _, id := range nodes {
			if id > norm && slices.ContainsFunc(g.Nodes[id].Inputs, func(in int) bool { return from[in] }) {
				from[id] = true
				if g.Nodes[id].Op == ir.Linear {
					proj = id
				}
			}
		}
		if proj < 0 {
			continue
		}
		to := map[int]bool{proj: true}
		for i := len(nodes) - 1; i >= 0; i-- {
			id := nodes[i]
			if id > norm && id < proj && from[id] && slices.ContainsFunc(consumers[id], func(c int) bool { return to[c] }) {
				to[id] = true
			}
		}
		for id := range to {
			m.of[id] |= MLP
		}
		m.mlpOut[proj] = true
	}
	return m
}

// Of returns the module node id belongs to, 0 for none.
func (m *ModuleMap) Of(id int) Module { return m.of[id] }

// preNorm reports whether node id is a norm that reads its layer's input
// (from another block) or a residual sum.
func preNorm(g *ir.Graph, id int) bool {
	n := &g.Nodes[id]
	if n.Op != ir.LayerNorm && n.Op != ir.RMSNorm || len(n.Inputs) == 0 || n.Inputs[0] < 0 {
		return false
	}
	in := &g.Nodes[n.Inputs[0]]
	return in.Block != n.Block || in.Op == ir.Add
}

// Drops reports whether recomputing modules r drops storage s: what the
// attention core allocates (SelectiveDrops), what a pre-norm allocates,
// or what the MLP allocates but its output.
func (m *ModuleMap) Drops(c *Costs, s int, r Module) bool {
	st := &c.Storages[s]
	in := m.of[st.Node] & r
	switch {
	case in&CoreAttn != 0:
		return c.SelectiveDrops(s, m.core)
	case in&LayerNorm != 0:
		return true
	case in&MLP != 0:
		return st.Role != Out || !m.mlpOut[st.Node]
	}
	return false
}
