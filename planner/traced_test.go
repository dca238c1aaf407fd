package planner

import (
	"strings"
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

// tracedLayers is a traced graph of two layers, each a product and an sdpa
// over q, k, v and a mask (four operands, as transformers passes sdpa a
// mask), then a product; the {mask} layer 1 reads is filled in by a test.
const tracedLayers = `graph:
  dtype: bf16
  traced: {batch: 1, seq: 4, by: "hand", attention: sdpa}
  inputs:
    - {name: x, shape: [1, 1, 4, 8], dtype: bf16}
    - {name: mask, shape: [1, 1, 4, 4], dtype: bf16}
  nodes:
    - {name: embed.mul, op: aten, fn: aten.mul.Tensor, block: embed, inputs: [x], shape: [1, 1, 4, 8], dtype: bf16, grad: true, params: 64, trainable_params: 8, param_dtype: bf16}
    - {name: layers.0.mm, op: aten, fn: aten.mm.default, block: layers.0, inputs: [embed.mul], shape: [1, 1, 4, 8], dtype: bf16, grad: true, saves: [in0], flops: 512, backward_flops: 1024}
    - {name: layers.0.mask, op: aten, fn: aten.slice.Tensor, block: layers.0, inputs: [mask], shape: [1, 1, 4, 4], dtype: bf16, view: 0}
    - {name: layers.0.sdpa, op: aten, fn: aten._scaled_dot_product_flash_attention_for_cpu.default, block: layers.0, inputs: [layers.0.mm, layers.0.mm, layers.0.mm, layers.0.mask], shape: [1, 1, 4, 8], dtype: bf16, outputs: [{shape: [1, 1, 4], dtype: fp32}], grad: true, saves: [in0, in3, out, out1], flops: 512, backward_flops: 1280}
    - {name: layers.0.out, op: aten, fn: aten.mm.default, block: layers.0, inputs: [layers.0.sdpa], shape: [1, 1, 4, 8], dtype: bf16, grad: true, saves: [in0], flops: 512, backward_flops: 1024}
    - {name: layers.1.mm, op: aten, fn: aten.mm.default, block: layers.1, inputs: [layers.0.out], shape: [1, 1, 4, 8], dtype: bf16, grad: true, saves: [in0], flops: 512, backward_flops: 1024}
    - {name: layers.1.sdpa, op: aten, fn: aten._scaled_dot_product_flash_attention_for_cpu.default, block: layers.1, inputs: [layers.1.mm, layers.1.mm, layers.1.mm, {mask}], shape: [1, 1, 4, 8], dtype: bf16, outputs: [{shape: [1, 1, 4], dtype: fp32}], grad: true, saves: [in0, out, out1], flops: 512, backward_flops: 1280, params: 8, trainable_params: 8, param_dtype: fp32}
    - {name: layers.1.out, op: aten, fn: aten.mm.default, block: layers.1, inputs: [layers.1.sdpa], shape: [1, 1, 4, 8], dtype: bf16, grad: true, saves: [in0], flops: 512, backward_flops: 1024}
    - {name: head.sum, op: aten, fn: aten.sum.default, block: head, inputs: [layers.1.out], shape: [], dtype: fp32, grad: true}
  output: head.sum
`

// TestTracedAttentionWithMask plans a traced sdpa of four operands with
// keep sets, counts parameters in a dtype of their own, and refuses a
// layer that reads another layer's tensor besides its input.
func TestTracedAttentionWithMask(t *testing.T) {
	src, err := graphio.Parse("g.yaml", []byte(strings.ReplaceAll(tracedLayers, "{mask}", "mask")))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src)
	if err != nil {
		t.Fatal(err)
	}
	stage.SearchKeepSets(p.Costs, p.Stages)
	if n := len(p.Stages[1].KeepSets); n < 2 {
		t.Errorf("layers.0 has %d keep sets, want a choice", n)
	}
	if a := p.Costs.Graph.Setup.Attention; a != "sdpa" {
		t.Errorf("attention %q, want the traced sdpa", a)
	}
	// 64 bf16 parameters, 8 of them trained (weights 2 B, gradients 2 B,
	// AdamW 8 B and an fp32 master copy 4 B each), and 8 trained fp32
	// ones (4 B, 4 B, 8 B, no master copy).
	s := p.Costs.Static
	if s.WeightsBytes != 64*2+8*4 || s.GradientsBytes != 8*2+8*4 || s.OptimizerBytes != 8*(8+4)+8*8 {
		t.Errorf("static = %+v, want weights 160 B, gradients 48 B, optimizer 160 B", s)
	}

	src, err = graphio.Parse("g.yaml", []byte(strings.ReplaceAll(tracedLayers, "{mask}", "layers.0.mask")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(src)
	const want = "layers.1.sdpa reads layers.0.mask, made in layers.0: a block may read only the previous block's output"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a layer reading another's mask: error %v, want %q", err, want)
	}
}
