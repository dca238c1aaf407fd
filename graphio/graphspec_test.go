package graphio

import (
	"os"
	"path/filepath"
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

func TestGraphSpec(t *testing.T) {
	tests := []struct {
		file string
		want []nodeSummary
	}{
		{"tiny-mlp.yaml", []nodeSummary{
			{"x", "input", "", ir.Shape{2, 16, 64}, nil},
			{"fc1", "linear", "graph", ir.Shape{2, 16, 256}, []string{"x"}},
			{"act", "gelu", "graph", ir.Shape{2, 16, 256}, []string{"fc1"}},
			{"fc2", "linear", "graph", ir.Shape{2, 16, 64}, []string{"act"}},
		}},
	}
	resmlp := []nodeSummary{
		{"x", "input", "", ir.Shape{2, 8, 32}, nil},
		{"stem", "linear", "graph", ir.Shape{2, 8, 32}, []string{"x"}},
	}
	prev := "stem"
	for i, p := range []string{"layers.0.", "layers.1.", "layers.2."} {
		b := p[:len(p)-1]
		resmlp = append(resmlp,
			nodeSummary{p + "norm", "layernorm", b, ir.Shape{2, 8, 32}, []string{prev}},
			nodeSummary{p + "up", "linear", b, ir.Shape{2, 8, 128}, []string{p + "norm"}},
			nodeSummary{p + "act", "gelu", b, ir.Shape{2, 8, 128}, []string{p + "up"}},
			nodeSummary{p + "down", "linear", b, ir.Shape{2, 8, 32}, []string{p + "act"}},
			nodeSummary{p + "add", "add", b, ir.Shape{2, 8, 32}, []string{prev, p + "down"}},
		)
		prev = p + "add"
		_ = i
	}
	resmlp = append(resmlp, nodeSummary{"head", "linear", "head", ir.Shape{2, 8, 10}, []string{"layers.2.add"}})
	tests = append(tests, struct {
		file string
		want []nodeSummary
	}{"resmlp.yaml", resmlp})
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
				t.Errorf("(-want +got)\n%s", diff)
			}
			if g.Nodes[g.Output].Name != tt.want[len(tt.want)-1].Name {
				t.Errorf("output = %s", g.Nodes[g.Output].Name)
			}
		})
	}
}

func TestGraphSpecDims(t *testing.T) {
	src, err := Load("testdata/graphs/tiny-mlp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	src.Graph.Dims["b"] = 5
	g, err := src.Graph.Build()
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Nodes[g.Output].Shape; !got.Equal(ir.Shape{5, 16, 64}) {
		t.Errorf("output shape with b = 5: %v", got)
	}
}

func FuzzParseGraph(f *testing.F) {
	files, _ := filepath.Glob("testdata/graphs/*.yaml")
	bad, _ := filepath.Glob("testdata/bad/graph-*.yaml")
	for _, p := range append(files, bad...) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Parse("graph.yaml", data)
		if err == nil && src.Kind == KindGraph {
			_, _ = src.Graph.Build()
		}
	})
}
