package planner

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// TestHullChoices checks hullChoices against its definition on random
// stages: a choice is left out exactly when another keeps no more for no
// more work, or two others, one keeping less and one more, mix to keep as
// much for no more (a point on or above the segment between them);
// storing and checkpointing are always offered.
func TestHullChoices(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(30)
		out := mem.Bytes(100 + rng.IntN(100))
		c := &solver.Chain{
			Forward: []float64{1 + 1000*rng.Float64()}, Backward: []float64{500 + 1000*rng.Float64()},
			TapeBytes: []mem.Bytes{out + 10000 + mem.Bytes(rng.IntN(1000))}, ActBytes: []mem.Bytes{out, out},
			ForwardTempBytes: []mem.Bytes{0}, BackwardTempBytes: []mem.Bytes{0},
		}
		var opts []solver.Option
		for range n {
			opts = append(opts, solver.Option{TapeBytes: out + 1 + mem.Bytes(rng.IntN(11000)), Backward: c.Backward[0] + 1200*rng.Float64()})
		}
		c.Options = [][]solver.Option{opts}
		cs := []int{0}
		for k := 1; k <= n; k++ {
			cs = append(cs, k)
		}
		cs = append(cs, solver.Checkpoint)
		type point struct{ kept, extra float64 }
		at := func(ch int) point {
			if ch == solver.Checkpoint {
				return point{float64(out), c.Forward[0]}
			}
			o := c.Option(0, ch)
			return point{float64(o.TapeBytes), o.Backward - c.Backward[0]}
		}
		var want []int
		for _, q := range cs {
			p, beaten := at(q), false
			for _, a := range cs {
				pa := at(a)
				if a == q {
					continue
				}
				if pa.kept <= p.kept && pa.extra <= p.extra && (pa != p || a < q) {
					beaten = true
				}
				for _, b := range cs {
					pb := at(b)
					if b == q || b == a || !(pa.kept < p.kept && p.kept < pb.kept) {
						continue
					}
					if pa.extra+(pb.extra-pa.extra)*(p.kept-pa.kept)/(pb.kept-pa.kept) <= p.extra {
						beaten = true
					}
				}
			}
			if !beaten || q == 0 || q == solver.Checkpoint {
				want = append(want, q)
			}
		}
		got := hullChoices(c, 0, cs)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: hull %v, want %v", trial, got, want)
		}
	}
}

// TestSelectivePipelineOnHull: in time, a chunk of many layers is offered
// each stage's hull and plans no dearer than storing or checkpointing
// each layer (the optimal strategy), within the budget; a chunk whose
// choices make at most solver.MaxFront plans is offered every one.
func TestSelectivePipelineOnHull(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Seq = 4096
	p, err := NewTimed(src, h100Roofline("time"))
	if err != nil {
		t.Fatal(err)
	}
	pp := Pipeline{Stages: 2, Microbatches: 4}
	for _, budget := range []mem.Bytes{68 << 30, 72 << 30, 80 << 30} {
		sel, err := p.PlanPipeline(&Options{Budget: budget, Strategy: Selective}, pp)
		if err != nil {
			t.Fatal(err)
		}
		opt, err := p.PlanPipeline(&Options{Budget: budget, Strategy: Optimal}, pp)
		if err != nil {
			t.Fatal(err)
		}
		if !opt.Feasible || !sel.Feasible || sel.Cost > opt.Cost || sel.PeakBytes > budget {
			t.Errorf("in %v: selective fits %v, %g ps at %v; optimal fits %v, %g ps", budget, sel.Feasible, sel.Cost, sel.PeakBytes, opt.Feasible, opt.Cost)
		}
	}
	p.SearchKeepSets()
	layer := -1
	for i, name := range p.names {
		if isLayer(name) {
			layer = i
			break
		}
	}
	all := []int{0}
	for k := 1; k < p.Chain.NumOptions(layer); k++ {
		all = append(all, k)
	}
	all = append(all, solver.Checkpoint)
	hull := hullChoices(p.Chain, layer, all)
	if len(hull) >= len(all) || len(all)*len(all)*len(all) <= solver.MaxFront {
		t.Fatalf("a layer has %d choices, %d on its hull: no test", len(all), len(hull))
	}
	for n := 1; n <= 3; n++ {
		s := solver.Segment{From: layer, To: layer + n}
		for range n {
			s.Choices = append(s.Choices, all)
		}
		got := onHull(p.Chain, s)
		want := hull
		if ways := int(math.Pow(float64(len(all)), float64(n))); ways <= solver.MaxFront {
			want = all
		}
		for j := range got {
			if !slices.Equal(got[j], want) {
				t.Errorf("%d layers: stage %d offered %d choices, want %d", n, j, len(got[j]), len(want))
			}
		}
	}
}
