package stage

import (
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

func TestCutPoints(t *testing.T) {
	g := ir.NewGraph("skip", ir.FP32)
	x, _ := g.AddInput("x", "", ir.Tensor{Shape: ir.Shape{2, 4}, DType: ir.FP32})
	a, _ := g.AddOp("a", "g", ir.Linear, ir.Attrs{Out: 4}, x)
	b, _ := g.AddOp("b", "g", ir.GELU, ir.Attrs{}, a)
	c, _ := g.AddOp("c", "g", ir.Add, ir.Attrs{}, a, b) // a skips over b
	d, _ := g.AddOp("d", "g", ir.Linear, ir.Attrs{Out: 4}, c)
	g.Output = d
	var names []string
	for _, id := range CutPoints(g) {
		names = append(names, g.Nodes[id].Name)
	}
	if diff := cmp.Diff([]string{"a", "c", "d"}, names); diff != "" {
		t.Errorf("cut points (-want +got)\n%s", diff)
	}
}
