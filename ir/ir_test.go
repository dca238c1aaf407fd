package ir

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestShapeBytesOverflow(t *testing.T) {
	if _, ok := (Shape{1 << 31, 1 << 31}).Bytes(FP32); ok {
		t.Error("2^62 fp32 elements did not overflow")
	}
	if b, ok := (Shape{1 << 30, 1 << 30}).Bytes(BF16); !ok || b != 1<<61 {
		t.Errorf("got %d, %v; want 2^61", b, ok)
	}
	if _, ok := (Shape{3, 0}).Bytes(FP32); ok {
		t.Error("zero dimension accepted")
	}
}

func TestInfer(t *testing.T) {
	f := func(s ...int64) Tensor { return Tensor{Shape(s), FP32} }
	ids := Tensor{Shape{2, 8}, Int64}
	tests := []struct {
		name string
		op   Op
		a    Attrs
		in   []Tensor
		want Tensor
		err  string
	}{
		{"linear", Linear, Attrs{Out: 12}, []Tensor{f(2, 8, 4)}, f(2, 8, 12), ""},
		{"embedding", Embedding, Attrs{Vocab: 10, Out: 4}, []Tensor{ids}, Tensor{Shape{2, 8, 4}, BF16}, ""},
		{"embedding of floats", Embedding, Attrs{Vocab: 10, Out: 4}, []Tensor{f(2, 8)}, Tensor{}, "int64 ids"},
		{"matmul", MatMul, Attrs{}, []Tensor{f(2, 3, 4, 5), f(2, 3, 5, 6)}, f(2, 3, 4, 6), ""},
		{"matmul transposed", MatMul, Attrs{TransposeB: true}, []Tensor{f(2, 3, 4, 5), f(2, 3, 7, 5)}, f(2, 3, 4, 7), ""},
		{"matmul inner mismatch", MatMul, Attrs{}, []Tensor{f(4, 5), f(6, 7)}, Tensor{}, "inner sizes 5 and 6"},
		{"add broadcasts", Add, Attrs{}, []Tensor{f(2, 8, 4), f(8, 4)}, f(2, 8, 4), ""},
		{"add mismatch", Add, Attrs{}, []Tensor{f(2, 8, 4), f(3, 4)}, Tensor{}, "do not broadcast"},
		{"softmax upcast", Softmax, Attrs{Upcast: true}, []Tensor{{Shape{2, 2}, BF16}}, f(2, 2), ""},
		{"repeat_kv", RepeatKV, Attrs{Heads: 8}, []Tensor{f(2, 2, 16, 4)}, f(2, 8, 16, 4), ""},
		{"repeat_kv indivisible", RepeatKV, Attrs{Heads: 6}, []Tensor{f(2, 4, 16, 4)}, Tensor{}, "kv dividing"},
		{"split", Split, Attrs{Parts: 3, Index: 2}, []Tensor{f(2, 9)}, f(2, 3), ""},
		{"split uneven", Split, Attrs{Parts: 2}, []Tensor{f(2, 9)}, Tensor{}, "not divisible"},
		{"split sizes", Split, Attrs{Parts: 3, Index: 1, Sizes: Shape{4, 2, 2}}, []Tensor{f(2, 8)}, f(2, 2), ""},
		{"split sizes short", Split, Attrs{Parts: 3, Sizes: Shape{4, 2, 1}}, []Tensor{f(2, 8)}, Tensor{}, "do not cut"},
		{"split sizes long", Split, Attrs{Parts: 2, Sizes: Shape{4, 5}}, []Tensor{f(2, 8)}, Tensor{}, "do not cut"},
		{"split sizes count", Split, Attrs{Parts: 2, Sizes: Shape{4, 2, 2}}, []Tensor{f(2, 8)}, Tensor{}, "3 sizes [4 2 2] for 2 parts"},
		{"transpose", Transpose, Attrs{Axis: 1, Axis2: -1}, []Tensor{f(2, 3, 4)}, f(2, 4, 3), ""},
		{"reshape -1", Reshape, Attrs{Shape: Shape{-1, 4}}, []Tensor{f(2, 3, 4)}, f(6, 4), ""},
		{"reshape wrong", Reshape, Attrs{Shape: Shape{5, 4}}, []Tensor{f(2, 3, 4)}, Tensor{}, "cannot reshape"},
		{"attention gqa", Attention, Attrs{Flash: true}, []Tensor{f(1, 8, 16, 4), f(1, 2, 16, 4), f(1, 2, 16, 4)}, f(1, 8, 16, 4), ""},
		{"cross entropy", CrossEntropy, Attrs{}, []Tensor{f(2, 8, 10), ids}, f(), ""},
		{"cross entropy mismatch", CrossEntropy, Attrs{}, []Tensor{f(2, 7, 10), ids}, Tensor{}, "want logits"},
		{"cast", Cast, Attrs{To: BF16}, []Tensor{f(3)}, Tensor{Shape{3}, BF16}, ""},
		{"arity", Add, Attrs{}, []Tensor{f(3)}, Tensor{}, "takes 2 inputs"},
		{"dropout p", Dropout, Attrs{P: 1}, []Tensor{f(3)}, Tensor{}, "not in [0, 1)"},
		{"topk", TopK, Attrs{TopK: 2}, []Tensor{f(32, 8)}, f(32, 2), ""},
		{"topk of too many", TopK, Attrs{TopK: 9}, []Tensor{f(32, 8)}, Tensor{}, "topk of 9 out of a last axis of 8"},
		{"dispatch", Dispatch, Attrs{Experts: 8}, []Tensor{f(32, 64), f(32, 2)}, f(64, 64), ""},
		{"dispatch of other tokens", Dispatch, Attrs{Experts: 8}, []Tensor{f(32, 64), f(16, 2)}, Tensor{}, "the tokens differ"},
		{"expert_linear", ExpertLinear, Attrs{Experts: 8, Out: 96}, []Tensor{f(64, 64), f(64, 64)}, f(64, 96), ""},
		{"expert_linear of other rows", ExpertLinear, Attrs{Experts: 8, Out: 96}, []Tensor{f(32, 64), f(64, 64)}, Tensor{}, "want the dispatch's 64 rows"},
		{"route_weights", RouteWeights, Attrs{}, []Tensor{f(32, 2), f(64, 64)}, f(64, 1), ""},
		{"combine", Combine, Attrs{TopK: 2}, []Tensor{f(64, 64), f(64, 64)}, f(32, 64), ""},
		{"combine uneven", Combine, Attrs{TopK: 3}, []Tensor{f(64, 64), f(64, 64)}, Tensor{}, "3 per token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Infer(tt.op, tt.a, tt.in, BF16)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestTopoOrderCycle(t *testing.T) {
	nodes := []Node{
		{Name: "x", Op: Input},
		{Name: "a", Op: GELU, Inputs: []int{3}},
		{Name: "b", Op: GELU, Inputs: []int{1}},
		{Name: "c", Op: Add, Inputs: []int{0, 2}},
		{Name: "d", Op: GELU, Inputs: []int{3}},
	}
	_, err := TopoOrder(nodes)
	var ce *CycleError
	if !errors.As(err, &ce) {
		t.Fatalf("TopoOrder error = %v, want a *CycleError", err)
	}
	if want := "cycle through a, b, c"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	nodes[1].Inputs = []int{0}
	order, err := TopoOrder(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 3, 4}, order); diff != "" {
		t.Errorf("order (-want +got)\n%s", diff)
	}
}

func TestCycleErrorNamesAtMostTen(t *testing.T) {
	var nodes []Node
	for i := 0; i < 15; i++ {
		nodes = append(nodes, Node{Name: string(rune('a' + i)), Op: GELU, Inputs: []int{(i + 1) % 15}})
	}
	_, err := TopoOrder(nodes)
	var ce *CycleError
	if !errors.As(err, &ce) || len(ce.Nodes) != MaxNamed || ce.Total != 15 || !strings.HasSuffix(err.Error(), "and 5 more") {
		t.Fatalf("error = %v", err)
	}
}

func TestValidate(t *testing.T) {
	g := NewGraph("t", FP32)
	x, _ := g.AddInput("x", "", Tensor{Shape{2, 4}, FP32})
	y, err := g.AddOp("fc", "b", Linear, Attrs{Out: 3}, x)
	if err != nil {
		t.Fatal(err)
	}
	g.Output = y
	if err := Validate(g); err != nil {
		t.Fatalf("valid graph: %v", err)
	}
	g.Nodes[y].Shape = Shape{2, 5}
	if err := Validate(g); err == nil || !strings.Contains(err.Error(), "its inputs give [2 3]") {
		t.Errorf("shape mismatch not caught: %v", err)
	}
	if _, err := g.AddOp("fc", "b", GELU, Attrs{}, x); err == nil {
		t.Error("duplicate name accepted")
	}
	if _, err := g.AddOp("z", "b", GELU, Attrs{}, 7); err == nil {
		t.Error("dangling input accepted")
	}
	if got := g.Params(y); got != 12 {
		t.Errorf("Params = %d, want 12", got)
	}
}

// TestValidateRouting: the ops that read a routing must read it from a
// topk's choices (dispatch) or a dispatch (the rest), of agreeing sizes.
func TestValidateRouting(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(g *Graph, x, top, d int) error
		want string // "" for a graph that validates
	}{
		{"well formed", func(g *Graph, x, top, d int) error {
			_, err := g.AddOp("up", "", ExpertLinear, Attrs{Experts: 64, Out: 8}, d, d)
			return err
		}, ""},
		{"dispatch by a non-topk", func(g *Graph, x, top, d int) error {
			_, err := g.AddOp("bad", "", Dispatch, Attrs{Experts: 64}, x, x)
			return err
		}, "dispatch routes by a topk's choices, but x is a input"},
		{"experts disagree", func(g *Graph, x, top, d int) error {
			_, err := g.AddOp("up", "", ExpertLinear, Attrs{Experts: 4, Out: 8}, d, d)
			return err
		}, "expert_linear of 4 experts reads dispatch, which routes to 64"},
		{"routing from a non-dispatch", func(g *Graph, x, top, d int) error {
			_, err := g.AddOp("tokens", "", Combine, Attrs{TopK: 1}, x, x)
			return err
		}, "combine reads its routing from a dispatch, but x is a input"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewGraph("moe", FP32)
			x, _ := g.AddInput("x", "", Tensor{Shape{32, 64}, FP32})
			p, _ := g.AddOp("probs", "", Softmax, Attrs{}, x)
			top, _ := g.AddOp("top", "", TopK, Attrs{TopK: 2}, p)
			d, _ := g.AddOp("dispatch", "", Dispatch, Attrs{Experts: 64}, x, top)
			err := tt.edit(g, x, top, d)
			if err == nil {
				g.Output = len(g.Nodes) - 1
				err = Validate(g)
			}
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("error = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestGrowKeepsNames: a graph grown for more nodes still finds the nodes
// it had, refuses a name twice, and finds the nodes added after.
func TestGrowKeepsNames(t *testing.T) {
	g := NewGraph("g", FP32)
	x, _ := g.AddInput("x", "", Tensor{Shape{2, 4}, FP32})
	g.Grow(100)
	if cap(g.Nodes) < 101 {
		t.Errorf("capacity %d after growing by 100 from 1", cap(g.Nodes))
	}
	if id, ok := g.Lookup("x"); !ok || id != x {
		t.Errorf(`Lookup("x") = %d, %v after Grow, want %d`, id, ok, x)
	}
	if _, err := g.AddInput("x", "", Tensor{Shape{2, 4}, FP32}); err == nil {
		t.Error("a second x after Grow: no error")
	}
	y, err := g.AddOp("y", "", Linear, Attrs{Out: 3}, x)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := g.Lookup("y"); !ok || id != y || len(g.Nodes) != 2 {
		t.Errorf(`Lookup("y") = %d, %v with %d nodes, want %d of 2`, id, ok, len(g.Nodes), y)
	}
}
