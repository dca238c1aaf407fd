package planner

import (
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/stage"
)

// TestTracedGraph plans graphio/testdata/graphs/traced.yaml, whose bytes
// are counted here by hand from what each op saves: a layer norm keeps
// its input (256 B) and statistics (2 × 32 B), a product its input (the
// norm's output, 256 B), a dropout its noise (256 B).
func TestTracedGraph(t *testing.T) {
	src, err := graphio.Load("../graphio/testdata/graphs/traced.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Costs
	if c.Graph.Setup.Batch != 2 || c.Graph.Setup.Seq != 4 || c.Graph.Setup.Profile != "transformers" {
		t.Errorf("setup = batch %d, seq %d, profile %s; want 2, 4, transformers", c.Graph.Setup.Batch, c.Graph.Setup.Seq, c.Graph.Setup.Profile)
	}
	want := map[string][3]int64{
		"embed":    {0, 0, 0},
		"layers.0": {256 + 32 + 32 + 256 + 256, 1024, 2048},
		"layers.1": {256 + 32 + 32 + 256, 1024, 2048},
		"head":     {0, 0, 0},
	}
	for _, b := range c.Blocks {
		got := [3]int64{b.SavedBytes, b.ForwardFLOPs, b.BackwardFLOPs}
		if got != want[b.Name] {
			t.Errorf("%s: saved, forward, backward = %v, want %v", b.Name, got, want[b.Name])
		}
	}
	if s := c.Static; s.Parameters != 80 || s.TrainableParameters != 80 || s.Total() != 80*(4+4+8) {
		t.Errorf("static = %+v, want 80 trained fp32 parameters under AdamW", s)
	}
	// Stages are the tracer's blocks, though the input feeds no cut point.
	if len(p.Stages) != 4 {
		t.Fatalf("%d stages, want 4 (embed, two layers, head)", len(p.Stages))
	}
	// The dropout's noise is written in place after empty_like makes it:
	// no keep set but keeping everything keeps it.
	stage.SearchKeepSets(c, p.Stages)
	st := p.Stages[1]
	if len(st.KeepSets) < 2 {
		t.Fatalf("layers.0 has %d keep sets, want a choice", len(st.KeepSets))
	}
	noise := -1
	for j, s := range st.Saved {
		if c.StorageName(s) == "layers.0.noise" {
			noise = j
		}
	}
	if noise < 0 {
		t.Fatalf("layers.0 saves no noise: %v", st.Saved)
	}
	for i := range st.KeepSets {
		k := &st.KeepSets[i]
		all := true
		for j := range st.Saved {
			all = all && k.Keeps(j)
		}
		if k.Keeps(noise) && !all {
			t.Errorf("keep set %s keeps the noise a later op writes in place", k.Name)
		}
	}
}
