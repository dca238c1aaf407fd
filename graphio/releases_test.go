package graphio

import (
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/ir"
)

// TestApplyRelease checks each release's numerics against what its
// transformers code does, read release by release: whether
// integrations/sdpa_attention.py calls .contiguous() on q, k and v (4.48 to
// 4.55) and passes enable_gqa (4.54 on), whether masking_utils.py makes the
// masks (4.53 on), GPT-2's eager_attention_forward (torch.where until 5.1,
// torch.full until 5.3), GPT2LMHeadModel's loss (its own CrossEntropyLoss
// until 4.47, self.loss_function from 4.48), Phi-3's apply_rotary_pos_emb
// (torch.cat from 4.48),
// Gemma's and Gemma 2's embedding scale (a registered buffer from 5.4),
// Gemma 2's _supports_sdpa (False from 5.21) and Mixtral's experts
// (@use_experts_implementation from 5.0).
func TestApplyRelease(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    ir.Numerics
		eager   bool // soft-capped attention runs eager only
		experts bool // mixtures of experts run through experts kernels
	}{
		{"4.46.3", ir.Numerics{LossShiftCopy: true, GPT2LossModelDType: true, Phi3AttnOutputs: true}, false, false},
		{"4.47", ir.Numerics{LossShiftCopy: true, GPT2LossModelDType: true, Phi3AttnOutputs: true}, false, false},
		{"4.48.0", ir.Numerics{SDPAContiguous: true, Phi3RopeCat: true, LossShiftCopy: true}, false, false},
		{"4.49.0", ir.Numerics{SDPAContiguous: true, Phi3RopeCat: true}, false, false},
		{"4.51.3", ir.Numerics{SDPAContiguous: true, Phi3RopeCat: true}, false, false},
		{"4.53.3", ir.Numerics{SDPAContiguous: true, Phi3RopeCat: true, ModelMasks: true}, false, false},
		{"4.54.1", ir.Numerics{SDPAContiguous: true, SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, false},
		{"4.55.4", ir.Numerics{SDPAContiguous: true, SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, false},
		{"4.56.2", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, false},
		{"4.57.6", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, false},
		{"5.0.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, true},
		{"5.1.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true}, false, true},
		{"5.2.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true}, false, true},
		{"5.3.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true}, false, true},
		{"5.4.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true, GPT2FloatScale: true, GemmaScaleBuffer: true}, false, true},
		{"5.20.2", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true, GPT2FloatScale: true, GemmaScaleBuffer: true}, false, true},
		{"5.21.1", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true, GPT2FloatScale: true, GemmaScaleBuffer: true}, true, true},
		{"5.24.0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true, GPT2FloatScale: true, GemmaScaleBuffer: true}, true, true},
		{"6.0.0.dev0", ir.Numerics{SDPAGQA: true, Phi3RopeCat: true, ModelMasks: true, GPT2AdditiveMask: true, GPT2FloatScale: true, GemmaScaleBuffer: true}, true, true},
	} {
		r, err := ParseRelease(tc.version)
		if err != nil {
			t.Errorf("ParseRelease(%q): %v", tc.version, err)
			continue
		}
		// The release's rules replace what the numerics said of them and
		// leave the others alone.
		s := ir.Setup{Numerics: ir.Numerics{SDPAContiguous: true, GQA: "repeat", NormFP32: true}}
		ApplyRelease(&s, r)
		tc.want.GQA, tc.want.NormFP32 = "repeat", true
		if s.Numerics != tc.want {
			t.Errorf("transformers %s: numerics %+v, want %+v", tc.version, s.Numerics, tc.want)
		}
		if got := strings.Join(strings.SplitN(tc.version, ".", 3)[:2], "."); s.Transformers != got {
			t.Errorf("transformers %s: Transformers = %q, want %q", tc.version, s.Transformers, got)
		}
		if rulesOf(r).expertsKernels != tc.experts {
			t.Errorf("transformers %s: experts kernels = %v, want %v", tc.version, !tc.experts, tc.experts)
		}
		if rulesOf(r).softcapEager != tc.eager {
			t.Errorf("transformers %s: soft-capped attention eager only = %v, want %v", tc.version, !tc.eager, tc.eager)
		}
	}
}

func TestParseReleaseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `want major.minor`},
		{"5", `want major.minor`},
		{"five.1", `want major.minor`},
		{"5.x", `want major.minor`},
		{"-1.2", `want major.minor`},
		{"4.45.2", "older than the oldest ckptplan plans for, 4.46"},
		{"3.0", "older than the oldest"},
	} {
		_, err := ParseRelease(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRelease(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

// TestReleaseRefusesSoftcapSDPA: transformers 5.21 and later build Gemma 2
// without sdpa; a plan for it with sdpa is refused, naming the field.
func TestReleaseRefusesSoftcapSDPA(t *testing.T) {
	src := `{"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}`
	m, err := ParseHFConfig("g.json", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if m.Training.Attention != "eager" {
		t.Errorf("Gemma 2 on transformers %s: attention %q, want eager", Newest, m.Training.Attention)
	}
	m.Training.Attention = "sdpa"
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "training.attention: transformers 5.24 runs no sdpa attention for gemma2") {
		t.Errorf("sdpa on 5.24: %v", err)
	}
	ApplyRelease(&m.Training, Release{5, 20})
	if err := m.Validate(); err != nil {
		t.Errorf("sdpa on 5.20: %v", err)
	}
}

// TestGPT2LossDType: GPT2LMHeadModel's own CrossEntropyLoss (transformers
// before 4.48) reads the logits in the model's dtype; from 4.48 the
// shared loss upcasts them (logits.float()), as every other family's
// does. The release's rule applies to GPT-2 alone.
func TestGPT2LossDType(t *testing.T) {
	const gpt2 = `{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "torch_dtype": "bfloat16"}`
	const llama = `{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "torch_dtype": "bfloat16"}`
	for _, tc := range []struct {
		config, release string
		upcast          bool
	}{
		{gpt2, "4.46", false},
		{gpt2, "4.47", false},
		{gpt2, "4.48", true},
		{gpt2, "5.24", true},
		{llama, "4.46", true},
	} {
		m, err := ParseHFConfig("config.json", []byte(tc.config))
		if err != nil {
			t.Fatal(err)
		}
		r, err := ParseRelease(tc.release)
		if err != nil {
			t.Fatal(err)
		}
		ApplyRelease(&m.Training, r)
		g, err := Build(m)
		if err != nil {
			t.Fatal(err)
		}
		loss := &g.Nodes[g.Output]
		if got := g.Nodes[loss.Inputs[0]].DType == ir.FP32; got != tc.upcast {
			t.Errorf("%s on transformers %s: the loss reads fp32 logits = %v, want %v", m.Family, tc.release, got, tc.upcast)
		}
	}
}
