package stage

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// loraBF16 sets a bf16 step with PEFT's fp32 adapters on every linear of
// the decoder layers, under profile.
func loraBF16(profile ir.Profile) func(*ir.Setup) {
	return func(s *ir.Setup) {
		s.Profile, s.DType = profile, "bf16"
		s.LoRA = ir.LoRA{Rank: 4, FP32: true, Alpha: 8,
			Targets: []ir.LoRATarget{"q", "k", "v", "o", "gate", "up", "down"}}
	}
}

// position returns the index in p of the first event that satisfies f,
// or -1.
func position(p Program, f func(Event) bool) int { return slices.IndexFunc(p, f) }

// TestModuleHoldsArguments checks where a layer's storing forward frees
// the post-attention norm's output, which no op saves under LoRA over
// bf16 weights (the adapters cast it to fp32, the frozen products keep
// their weights): PyTorch's LlamaMLP holds its argument until it returns,
// after the down projection, under the transformers profile; the
// executor's programs (torch-eager) free it after its last reader, the
// up projection.
func TestModuleHoldsArguments(t *testing.T) {
	for _, tc := range []struct {
		profile ir.Profile
		after   string // the node whose run the free follows
	}{
		{ir.ProfileTransformers, "mlp.down_proj"},
		{ir.ProfileTorchEager, "mlp.up_proj"},
	} {
		st := build(t, "tiny-llama", loraBF16(tc.profile))[1]
		c, g := st.Costs(), st.Costs().Graph
		norm := slices.IndexFunc(g.Nodes, func(n ir.Node) bool { return n.Name == "layers.0.post_attention_layernorm" })
		if norm < 0 {
			t.Fatal("no layers.0.post_attention_layernorm")
		}
		out := c.OutputStorage(norm)
		all := st.keepAll()
		p := st.StoringProgram(&all)
		free := position(p, func(e Event) bool { return e.Kind == Free && e.Buf == StorageBuf && e.Storage == out })
		if free < 0 {
			t.Fatalf("%s: the norm's output is never freed", tc.profile)
		}
		k := free - 1
		for k >= 0 && p[k].Kind != RunForward {
			k--
		}
		if got := g.Nodes[p[k].Node].Name; got != "layers.0."+tc.after {
			t.Errorf("%s: the norm's output is freed after %s, want after layers.0.%s", tc.profile, got, tc.after)
		}
	}
}

// TestPEFTWorkspace checks the working memory of an adapted product
// (peftBytes). Its fp32 adapters over a bf16 base: forward, the base's
// output promoted to fp32, the scaled adapters' output and their sum;
// backward, the output's gradient in fp32, scaled, and cast back to
// bf16. All in fp32: forward, the base's output and the scaled one beside
// their sum; backward, the scaled gradient. Before a rerun, the backward
// has made the scaled gradient (and, mixed, the base's bf16 one).
func TestPEFTWorkspace(t *testing.T) {
	for _, tc := range []struct {
		dtype                  string
		forward, backward, pre func(o mem.Bytes) mem.Bytes // of the output's bytes
	}{
		{"bf16", func(o mem.Bytes) mem.Bytes { return 6 * o }, func(o mem.Bytes) mem.Bytes { return 5 * o },
			func(o mem.Bytes) mem.Bytes { return 3 * o }},
		{"fp32", func(o mem.Bytes) mem.Bytes { return 2 * o }, func(o mem.Bytes) mem.Bytes { return o },
			func(o mem.Bytes) mem.Bytes { return o }},
	} {
		st := build(t, "tiny-llama", func(s *ir.Setup) {
			loraBF16(ir.ProfileTransformers)(s)
			s.DType = tc.dtype
		})[1]
		c, g := st.Costs(), st.Costs().Graph
		down := slices.IndexFunc(g.Nodes, func(n ir.Node) bool { return n.Name == "layers.0.mlp.down_proj" })
		o := mem.Bytes(c.Storages[c.OutputStorage(down)].Bytes)
		if got, want := workspaceBytes(c, down, false), tc.forward(o); got != want {
			t.Errorf("%s forward: %d bytes, want %d", tc.dtype, got, want)
		}
		if got, want := workspaceBytes(c, down, true), tc.backward(o); got != want {
			t.Errorf("%s backward: %d bytes, want %d", tc.dtype, got, want)
		}
		if id, got := st.beforeUnpack(); id != down || got != tc.pre(o) {
			t.Errorf("%s, before the rerun: %d bytes of %s, want %d of %s", tc.dtype, got, g.Nodes[max(id, 0)].Name, tc.pre(o), g.Nodes[down].Name)
		}
	}
	eager := build(t, "tiny-llama", loraBF16(ir.ProfileTorchEager))[1]
	down := slices.IndexFunc(eager.Costs().Graph.Nodes, func(n ir.Node) bool { return n.Name == "layers.0.mlp.down_proj" })
	if got := peftBytes(eager.Costs(), down, false); got != 0 {
		t.Errorf("torch-eager: %d bytes of PEFT's working memory, want none (the executor's scratch)", got)
	}
}

// TestRerunHoldsLikeForward checks a checkpoint's rerun under the
// transformers profile: it is the layer's own code, so the residual sum
// after attention, which the layer's variable holds to the last add,
// stays to the rerun's end, though the rerun's last reader of it is the
// post-attention norm; the executor's rerun (torch-eager) frees it there.
func TestRerunHoldsLikeForward(t *testing.T) {
	for _, tc := range []struct {
		profile ir.Profile
		toEnd   bool
	}{
		{ir.ProfileTransformers, true},
		{ir.ProfileTorchEager, false},
	} {
		st := build(t, "tiny-llama", loraBF16(tc.profile))[1]
		c, g := st.Costs(), st.Costs().Graph
		node := func(name string) int {
			return slices.IndexFunc(g.Nodes, func(n ir.Node) bool { return n.Name == "layers.0."+name })
		}
		resid, last := node("resid_1"), node("resid_2")
		k := slices.IndexFunc(st.KeepSets, func(k KeepSet) bool {
			return slices.Contains(k.Recompute, resid) && slices.Contains(k.Recompute, node("post_attention_layernorm")) &&
				!slices.Contains(k.Recompute, last) && !st.Holds(&k, c.OutputStorage(resid))
		})
		if k < 0 {
			t.Fatalf("%s: no keep set reruns resid_1 and not resid_2", tc.profile)
		}
		p := st.RecomputeProgram(&st.KeepSets[k])
		free := position(p, func(e Event) bool {
			return e.Kind == Free && e.Buf == StorageBuf && e.Storage == c.OutputStorage(resid)
		})
		rerun := slices.IndexFunc(p[free+1:], func(e Event) bool { return e.Kind == Rerun }) >= 0
		if free < 0 || rerun == tc.toEnd {
			t.Errorf("%s, %s: resid_1 freed at event %d of %d, a rerun after it: %v", tc.profile, st.KeepSets[k].Name, free, len(p), rerun)
		}
	}
}

// TestBlockHoldsAttentionOutput checks the layers whose code holds the
// attention's output to their end (ir.Attrs.HeldTo): GPT-2's block
// (attn_output) and Phi-3's layer before transformers 4.48 (attn_outputs).
// Under LoRA over bf16 weights no op saves it; it is freed after the
// layer's last add under the transformers profile, after the first add,
// its last reader, under torch-eager and for Phi-3 from 4.48.
func TestBlockHoldsAttentionOutput(t *testing.T) {
	for _, tc := range []struct {
		model, out string
		profile    ir.Profile
		release    graphio.Release
		after      string
	}{
		{"tiny-gpt2", "attn.out_proj", ir.ProfileTransformers, graphio.Release{Major: 5, Minor: 24}, "resid_2"},
		{"tiny-gpt2", "attn.out_proj", ir.ProfileTorchEager, graphio.Release{Major: 5, Minor: 24}, "resid_1"},
		{"phi-3-mini", "attn.o_proj", ir.ProfileTransformers, graphio.Release{Major: 4, Minor: 46}, "resid_2"},
		{"phi-3-mini", "attn.o_proj", ir.ProfileTransformers, graphio.Release{Major: 4, Minor: 48}, "resid_1"},
	} {
		name := fmt.Sprintf("%s, %s, %v", tc.model, tc.profile, tc.release)
		st := build(t, tc.model, func(s *ir.Setup) {
			loraBF16(tc.profile)(s)
			s.Batch, s.Seq = 1, 16
			graphio.ApplyRelease(s, tc.release)
			if tc.model == "tiny-gpt2" {
				s.LoRA.Targets = []ir.LoRATarget{"q", "k", "v", "o", "up", "down"}
			}
			s.Dropout = 0
		})[1]
		c, g := st.Costs(), st.Costs().Graph
		o := slices.IndexFunc(g.Nodes, func(n ir.Node) bool { return n.Name == "layers.0."+tc.out })
		all := st.keepAll()
		p := st.StoringProgram(&all)
		free := position(p, func(e Event) bool {
			return e.Kind == Free && e.Buf == StorageBuf && e.Storage == c.OutputStorage(o)
		})
		if free < 0 {
			t.Fatalf("%s: the attention's output is never freed", name)
		}
		k := free - 1
		for k >= 0 && p[k].Kind != RunForward {
			k--
		}
		if got := g.Nodes[p[k].Node].Name; got != "layers.0."+tc.after {
			t.Errorf("%s: the attention's output is freed after %s, want after layers.0.%s", name, got, tc.after)
		}
	}
}
