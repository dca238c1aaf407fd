package graphio

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

type nodeSummary struct {
	Name, Op, Block string
	Shape           ir.Shape
	Inputs          []string
}

func summarizeGraph(g *ir.Graph) []nodeSummary {
	var out []nodeSummary
	for _, n := range g.Nodes {
		s := nodeSummary{Name: n.Name, Op: n.Op.String(), Block: n.Block, Shape: n.Shape}
		for _, in := range n.Inputs {
			s.Inputs = append(s.Inputs, g.Nodes[in].Name)
		}
		out = append(out, s)
	}
	return out
}

// residualBlocks returns the nodes of count iterations of a pre-norm
// residual MLP block named name, fed by the node named first.
func residualBlocks(name, first string, count int, shape, wide ir.Shape, ops []string) []nodeSummary {
	var out []nodeSummary
	prev := first
	for i := range count {
		b := fmt.Sprintf("%s.%d", name, i)
		for _, op := range ops {
			switch op {
			case "norm", "n":
				out = append(out, nodeSummary{b + "." + op, "layernorm", b, shape, []string{prev}})
			case "up":
				out = append(out, nodeSummary{b + ".up", "linear", b, wide, []string{out[len(out)-1].Name}})
			case "act":
				out = append(out, nodeSummary{b + ".act", "gelu", b, wide, []string{b + ".up"}})
			case "down":
				out = append(out, nodeSummary{b + ".down", "linear", b, shape, []string{out[len(out)-1].Name}})
			case "add":
				out = append(out, nodeSummary{b + ".add", "add", b, shape, []string{prev, b + ".down"}})
			}
		}
		prev = b + ".add"
	}
	return out
}

func TestGraphSpec(t *testing.T) {
	tiny := append([]nodeSummary{
		{"x", "input", "", ir.Shape{2, 16, 64}, nil},
		{"fc1", "linear", "graph", ir.Shape{2, 16, 256}, []string{"x"}},
		{"act", "gelu", "graph", ir.Shape{2, 16, 256}, []string{"fc1"}},
		{"fc2", "linear", "graph", ir.Shape{2, 16, 64}, []string{"act"}},
	}, residualBlocks("layers", "fc2", 3, ir.Shape{2, 16, 64}, ir.Shape{2, 16, 256}, []string{"n", "up", "down", "add"})...)

	// resmlp lists add before the nodes it reads: the build puts it last.
	resmlp := append([]nodeSummary{
		{"x", "input", "", ir.Shape{2, 8, 32}, nil},
		{"stem", "linear", "graph", ir.Shape{2, 8, 32}, []string{"x"}},
	}, residualBlocks("layers", "stem", 3, ir.Shape{2, 8, 32}, ir.Shape{2, 8, 128}, []string{"norm", "up", "act", "down", "add"})...)
	resmlp = append(resmlp, nodeSummary{"head", "linear", "head", ir.Shape{2, 8, 10}, []string{"layers.2.add"}})

	bsh, bhsd, bhss := ir.Shape{2, 8, 64}, ir.Shape{2, 4, 8, 16}, ir.Shape{2, 4, 8, 8}
	attention := []nodeSummary{
		{"x", "input", "", bsh, nil},
		{"q", "linear", "graph", bsh, []string{"x"}},
		{"k", "linear", "graph", bsh, []string{"x"}},
		{"v", "linear", "graph", bsh, []string{"x"}},
		{"q_heads", "reshape", "graph", ir.Shape{2, 8, 4, 16}, []string{"q"}},
		{"k_heads", "reshape", "graph", ir.Shape{2, 8, 4, 16}, []string{"k"}},
		{"v_heads", "reshape", "graph", ir.Shape{2, 8, 4, 16}, []string{"v"}},
		{"q_t", "transpose", "graph", bhsd, []string{"q_heads"}},
		{"k_t", "transpose", "graph", bhsd, []string{"k_heads"}},
		{"v_t", "transpose", "graph", bhsd, []string{"v_heads"}},
		{"scores", "matmul", "graph", bhss, []string{"q_t", "k_t"}},
		{"scaled", "scale", "graph", bhss, []string{"scores"}},
		{"masked", "causal_mask", "graph", bhss, []string{"scaled"}},
		{"probs", "softmax", "graph", bhss, []string{"masked"}},
		{"ctx", "matmul", "graph", bhsd, []string{"probs", "v_t"}},
		{"ctx_t", "transpose", "graph", ir.Shape{2, 8, 4, 16}, []string{"ctx"}},
		{"merged", "reshape", "graph", bsh, []string{"ctx_t"}},
		{"o", "linear", "graph", bsh, []string{"merged"}},
		{"res", "add", "graph", bsh, []string{"x", "o"}},
	}

	tests := []struct {
		file   string
		dtype  ir.DType
		output string
		want   []nodeSummary
	}{
		{"tiny-mlp.yaml", ir.FP32, "layers.2.add", tiny},
		{"resmlp.yaml", ir.FP32, "head", resmlp},
		{"attention.yaml", ir.BF16, "res", attention},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			src, err := Load(filepath.Join("testdata/graphs", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			if src.Kind != KindGraph {
				t.Fatalf("kind = %v, want graph", src.Kind)
			}
			g, err := src.Graph.Build()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, summarizeGraph(g)); diff != "" {
				t.Errorf("nodes (-want +got)\n%s", diff)
			}
			if got := g.Nodes[g.Output].Name; got != tt.output {
				t.Errorf("output = %s, want %s", got, tt.output)
			}
			if g.DType != tt.dtype || g.Setup.DType != tt.dtype.String() {
				t.Errorf("dtype = %v, setup dtype %s; want %v", g.DType, g.Setup.DType, tt.dtype)
			}
			if err := ir.Validate(g); err != nil {
				t.Error(err)
			}
		})
	}
}

// parseGraph parses an inline graph document.
func parseGraph(t *testing.T, doc string) (*GraphSpec, error) {
	t.Helper()
	src, err := Parse("g.yaml", []byte(doc))
	if err != nil {
		return nil, err
	}
	if src.Kind != KindGraph {
		t.Fatalf("kind = %v, want graph", src.Kind)
	}
	return src.Graph, nil
}

func buildGraph(t *testing.T, doc string) *ir.Graph {
	t.Helper()
	s, err := parseGraph(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGraphSpecOrder checks forward references and repeats: nodes may
// be listed in any order, a node may name a repeat listed after it, and
// a repeat fed by another repeat chains through its last iteration.
func TestGraphSpecOrder(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string // node: inputs
	}{
		{"reversed", `
graph:
  dims: {n: 4}
  inputs: [{name: x, shape: [n]}]
  nodes:
    - {name: c, op: add, inputs: [a, b]}
    - {name: b, op: silu, inputs: [a]}
    - {name: a, op: gelu, inputs: [x]}
  output: c
`, []string{"x:", "a: x", "b: a", "c: a b"}},
		{"repeat after its reader", `
graph:
  dims: {n: 4}
  inputs: [{name: x, shape: [n]}]
  nodes:
    - {name: head, op: gelu, inputs: [blocks]}
    - repeat: {name: blocks, count: 2, input: x, nodes: [{name: f, op: gelu, inputs: [x]}]}
  output: head
`, []string{"x:", "blocks.0.f: x", "blocks.1.f: blocks.0.f", "head: blocks.1.f"}},
		{"repeat after repeat", `
graph:
  dims: {n: 4}
  inputs: [{name: x, shape: [n]}]
  nodes:
    - repeat: {name: a, count: 2, nodes: [{name: f, op: gelu, inputs: [x]}]}
    - repeat: {name: b, count: 2, nodes: [{name: g, op: add, inputs: [a, x]}]}
  output: b
`, []string{"x:", "a.0.f: x", "a.1.f: a.0.f", "b.0.g: a.1.f x", "b.1.g: b.0.g x"}},
		{"repeat output not last", `
graph:
  dims: {n: 4}
  inputs: [{name: x, shape: [n]}]
  nodes:
    - {name: pre, op: gelu, inputs: [x]}
    - repeat:
        count: 2
        output: mid
        nodes:
          - {name: mid, op: silu, inputs: [pre]}
          - {name: side, op: gelu, inputs: [mid]}
  output: layers.1.side
`, []string{"x:", "pre: x", "layers.0.mid: pre", "layers.0.side: layers.0.mid", "layers.1.mid: layers.0.mid", "layers.1.side: layers.1.mid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := buildGraph(t, tt.doc)
			var got []string
			for _, n := range summarizeGraph(g) {
				got = append(got, strings.TrimSpace(n.Name+": "+strings.Join(n.Inputs, " ")))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestGraphSpecDims rebuilds a spec after changing its dims and dtype:
// the shapes and the setup follow, the first graph is untouched.
func TestGraphSpecDims(t *testing.T) {
	src, err := Load("testdata/graphs/attention.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := src.Graph
	g1, err := s.Build()
	if err != nil {
		t.Fatal(err)
	}
	s.Dims["b"], s.Dims["s"] = 5, 32
	s.DType = ir.FP16
	g2, err := s.Build()
	if err != nil {
		t.Fatal(err)
	}
	type sum struct {
		Batch, Seq int64
		DType      string
		Scores     ir.Shape
		Output     ir.Shape
	}
	get := func(g *ir.Graph) sum {
		id, _ := g.Lookup("scores")
		return sum{g.Setup.Batch, g.Setup.Seq, g.Setup.DType, g.Nodes[id].Shape, g.Nodes[g.Output].Shape}
	}
	want := []sum{
		{2, 8, "bf16", ir.Shape{2, 4, 8, 8}, ir.Shape{2, 8, 64}},
		{5, 32, "fp16", ir.Shape{5, 4, 32, 32}, ir.Shape{5, 32, 64}},
	}
	if diff := cmp.Diff(want, []sum{get(g1), get(g2)}); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}

	s.Dims["b"] = 0
	if _, err := s.Build(); err == nil || !strings.Contains(err.Error(), "attention.yaml:8:30: graph.inputs[0].shape[0]: size 0 must be positive") {
		t.Errorf("build with b = 0: %v", err)
	}
}

// TestGraphSpecErrors covers errors that the bad-input corpus does not.
func TestGraphSpecErrors(t *testing.T) {
	const head = "graph:\n  dims: {b: 2, h: 8}\n  inputs: [{name: x, shape: [b, h]}]\n  nodes:\n"
	tests := []struct {
		name, nodes, want string
	}{
		{"missing name", "    - {op: gelu, inputs: [x]}\n  output: a\n",
			"g.yaml:5:7: graph.nodes[0]: missing name"},
		{"missing op", "    - {name: a, inputs: [x]}\n  output: a\n",
			`g.yaml:5:7: graph.nodes[0]: unknown op "" (valid: add, aten, attention,`},
		{"input op", "    - {name: a, op: input}\n  output: a\n",
			`g.yaml:5:21: graph.nodes[0]: unknown op "input"`},
		{"node not a mapping", "    - a\n  output: a\n",
			`g.yaml:5:7: graph.nodes[0]: want a mapping of keys to values, got "a"`},
		{"empty repeat", "    - repeat:\n  output: a\n",
			"g.yaml:5:14: graph.nodes[0].repeat: is empty, want count and nodes"},
		{"repeat without nodes", "    - repeat: {count: 2}\n  output: a\n",
			"g.yaml:5:15: graph.nodes[0].repeat: no nodes to repeat"},
		{"repeat block", "    - repeat: {count: 2, nodes: [{name: n, op: gelu, inputs: [x], block: b}]}\n  output: layers\n",
			"g.yaml:5:74: graph.nodes[0].repeat.nodes[0].block: a repeated node's block is its iteration"},
		{"repeat output", "    - repeat: {count: 2, output: m, nodes: [{name: n, op: gelu, inputs: [x]}]}\n  output: layers\n",
			`g.yaml:5:34: graph.nodes[0].repeat.output: "m" is not a node of the repeated block`},
		{"repeat input in body", "    - repeat: {count: 2, input: n, nodes: [{name: n, op: gelu, inputs: [n]}]}\n  output: layers\n",
			`g.yaml:5:33: graph.nodes[0].repeat.input: "n" names a node of the repeated block`},
		{"repeat named twice", "    - repeat: {count: 2, nodes: [{name: n, op: gelu, inputs: [x]}]}\n    - repeat: {count: 2, nodes: [{name: m, op: gelu, inputs: [x]}]}\n  output: layers\n",
			`g.yaml:6:15: graph.nodes[1].repeat: repeat name "layers" is used twice`},
		{"repeat named like a node", "    - {name: r, op: gelu, inputs: [x]}\n    - repeat: {name: r, count: 2, nodes: [{name: n, op: gelu, inputs: [r]}]}\n  output: r\n",
			`g.yaml:6:22: graph.nodes[1].repeat: repeat name "r" is also the name of a node`},
		{"dangling in repeat", "    - repeat: {count: 2, input: x, nodes: [{name: n, op: add, inputs: [x, y]}]}\n  output: layers\n",
			`g.yaml:5:75: graph.nodes[0].repeat.nodes[0]: input "y" of node layers.0.n is not defined`},
		{"duplicate input", "    - {name: x, op: gelu, inputs: [x]}\n  output: x\n",
			`g.yaml:5:14: graph.nodes[0]: node name "x" is used twice`},
		{"output is an input", "    - {name: a, op: gelu, inputs: [x]}\n  output: x\n",
			`g.yaml:6:11: graph.output: "x" is a graph input`},
		{"no nodes", "    []\n  output: x\n",
			"g.yaml:5:5: graph: no nodes"},
		{"-1 outside a reshape", "    - {name: a, op: linear, inputs: [x], out: -1}\n  output: a\n",
			"g.yaml:5:47: graph.nodes[0].out: size -1 must be positive"},
		{"bad cast dtype", "    - {name: a, op: cast, inputs: [x], to: fp8}\n  output: a\n",
			`g.yaml:5:44: graph.nodes[0].to: unknown dtype "fp8"`},
		{"empty product term", "    - {name: a, op: linear, inputs: [x], out: 2**h}\n  output: a\n",
			`g.yaml:5:47: graph.nodes[0].out: "" is neither a positive integer nor a dim`},
		{"split sizes short", "    - {name: a, op: split, inputs: [x], sizes: [4, 2]}\n  output: a\n",
			"g.yaml:5:7: node a: split: sizes [4 2] do not cut the last axis of [2 8]"},
		{"split sizes on another op", "    - {name: a, op: gelu, inputs: [x], sizes: [4, 4]}\n  output: a\n",
			"g.yaml:5:40: graph.nodes[0]: gelu takes no sizes (it is for split)"},
		{"aten without fn", "    - {name: a, op: aten, inputs: [x], shape: [2, 8], dtype: fp32}\n  output: a\n",
			"graph.nodes[0]: an aten node needs fn, the PyTorch op it ran"},
		{"aten without dtype", "    - {name: a, op: aten, fn: aten.relu.default, inputs: [x], shape: [2, 8]}\n  output: a\n",
			"graph.nodes[0]: needs shape and dtype"},
		{"aten negative flops", "    - {name: a, op: aten, fn: aten.mm.default, inputs: [x], shape: [2, 8], dtype: fp32, flops: -1}\n  output: a\n",
			"graph.nodes[0].flops: must not be negative, got -1"},
		{"aten trains more than it has", "    - {name: a, op: aten, fn: aten.mm.default, inputs: [x], shape: [2, 8], dtype: fp32, params: 4, trainable_params: 5}\n  output: a\n",
			"graph.nodes[0].trainable_params: 5, more than its 4 params"},
		{"aten saves what it has not", "    - {name: a, op: aten, fn: aten.relu.default, inputs: [x], shape: [2, 8], dtype: fp32, saves: [in1]}\n  output: a\n",
			`graph.nodes[0].saves[0]: "in1" is not one of its inputs (in0..in0) or outputs (out, out1..out0)`},
		{"aten view of no output", "    - {name: a, op: aten, fn: aten.view.default, inputs: [x], shape: [16], dtype: fp32, view: 16}\n  output: a\n",
			"graph.nodes[0].view: 16 is not an output"},
		{"aten param dtype", "    - {name: a, op: aten, fn: aten.mm.default, inputs: [x], shape: [2, 8], dtype: fp32, params: 64, param_dtype: int8}\n  output: a\n",
			`graph.nodes[0].param_dtype: "int8" is not a floating-point dtype`},
		{"aten param dtype without params", "    - {name: a, op: aten, fn: aten.mm.default, inputs: [x], shape: [2, 8], dtype: fp32, param_dtype: bf16}\n  output: a\n",
			"graph.nodes[0].param_dtype: the node has no params"},
		{"param dtype on a linear", "    - {name: a, op: linear, inputs: [x], out: 4, param_dtype: bf16}\n  output: a\n",
			"graph.nodes[0]: linear takes no param_dtype"},
		{"shape in repeat", "    - repeat: {count: 2, input: x, nodes: [{name: n, op: linear, inputs: [x], out: 3}, {name: m, op: add, inputs: [n, x]}]}\n  output: layers\n",
			"g.yaml:5:88: node layers.0.m: add: shapes [2 3] and [2 8] do not broadcast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := parseGraph(t, head+tt.nodes)
			if err == nil {
				_, err = s.Build()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func TestGraphSpecHeader(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"empty graph", "graph:\n", "g.yaml:1:7: graph: is empty"},
		{"bad dtype", "graph:\n  dtype: int64\n", `g.yaml:2:10: graph.dtype: unknown value "int64" (valid: fp32, bf16, fp16)`},
		{"bad dim name", "graph:\n  dims: {2x: 3}\n", `g.yaml:2:10: graph.dims: "2x" is not a dim name`},
		{"input without shape", "graph:\n  inputs: [{name: x}]\n  nodes: [{name: a, op: gelu, inputs: [x]}]\n", "g.yaml:2:12: graph.inputs[0]: missing shape"},
		{"input dtype", "graph:\n  inputs: [{name: x, shape: [], dtype: int4}]\n  nodes: [{name: a, op: gelu, inputs: [x]}]\n", `g.yaml:2:40: graph.inputs[0].dtype: unknown dtype "int4"`},
		{"dims list", "graph:\n  dims: [b, 2]\n", "g.yaml:2:9: graph.dims: want a mapping, got a list"},
		{"traced batch", "graph:\n  traced: {batch: 0, seq: 4}\n  inputs: [{name: x, shape: [2]}]\n  nodes: [{name: a, op: gelu, inputs: [x]}]\n  output: a\n",
			"graph.traced: batch and seq must be positive, got 0 and 4"},
		{"traced attention", "graph:\n  traced: {batch: 1, seq: 4, attention: flex}\n  inputs: [{name: x, shape: [2]}]\n  nodes: [{name: a, op: gelu, inputs: [x]}]\n  output: a\n",
			`graph.traced.attention: unknown value "flex" (valid: eager, sdpa, sdpa-math, flash)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseGraph(t, tt.doc)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestGraphSpecTooLarge checks the bound on the expanded node count.
func TestGraphSpecTooLarge(t *testing.T) {
	var b strings.Builder
	b.WriteString("graph:\n  dims: {n: 4}\n  inputs: [{name: x, shape: [n]}]\n  nodes:\n    - repeat:\n        count: 10000\n        nodes:\n          - {name: n0, op: gelu, inputs: [x]}\n")
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&b, "          - {name: n%d, op: gelu, inputs: [n%d]}\n", i, i-1)
	}
	b.WriteString("  output: layers\n")
	_, err := parseGraph(t, b.String())
	want := "g.yaml:6:16: graph.nodes[0].repeat: the graph would have more than 250000 nodes"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error = %v\nwant it to contain %q", err, want)
	}
}

func TestGraphSpecName(t *testing.T) {
	s, err := parseGraph(t, "graph:\n  inputs: [{name: x, shape: [3]}]\n  nodes: [{name: a, op: gelu, inputs: [x]}]\n  output: a\n")
	if err != nil {
		t.Fatal(err)
	}
	got := []any{s.Name, s.DType, len(s.Dims)}
	if diff := cmp.Diff([]any{"g", ir.FP32, 0}, got); diff != "" {
		t.Errorf("defaults (-want +got)\n%s", diff)
	}
}

// FuzzParseGraph checks that no graph document makes Parse or Build
// panic.
func FuzzParseGraph(f *testing.F) {
	addSeeds(f, "testdata/graphs/*.yaml", "testdata/bad/graph-*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Parse("graph.yaml", data)
		if err == nil && src.Kind == KindGraph {
			if g, err := src.Graph.Build(); err == nil {
				if err := ir.Validate(g); err != nil {
					t.Errorf("built an invalid graph: %v", err)
				}
			}
		}
	})
}

// TestGraphSpecSplitSizes: a fused projection cut into parts of their own
// sizes (Phi-3's q, k and v with fewer kv heads), sizes given by dims.
func TestGraphSpecSplitSizes(t *testing.T) {
	s, err := parseGraph(t, `graph:
  dims: {b: 2, q: 8, kv: 2}
  inputs: [{name: x, shape: [b, 12]}]
  nodes:
    - {name: k, op: split, inputs: [x], sizes: [q, kv, kv], index: 1}
    - {name: v, op: split, inputs: [x], sizes: [q, kv, kv], index: 2}
    - {name: o, op: add, inputs: [k, v]}
  output: o
`)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Build()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := g.Lookup("k")
	if sh := g.Nodes[k].Shape; !sh.Equal(ir.Shape{2, 2}) {
		t.Errorf("k has shape %v, want [2 2]", sh)
	}
	if off, size := g.Nodes[k].Attrs.SplitPart(12); off != 8 || size != 2 {
		t.Errorf("k is [%d, +%d) of x, want [8, +2)", off, size)
	}
}
