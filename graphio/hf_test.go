package graphio

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// hfSetup is the default training setup with what a config.json sets.
// hfSetup is what transformers 5.24 does by default on PyTorch 2: sdpa,
// handed q, k and v as they are and K and V unexpanded where the model's
// masks leave a layer none (integrations/sdpa_attention.py,
// masking_utils.py), GPT-2's eager attention scaled by a float and masked
// by addition (models/gpt2/modeling_gpt2.py), Gemma's embeddings scaled by
// a registered buffer (models/gemma/modeling_gemma.py), and a loss that reads the
// logits in fp32 (LlamaForCausalLM's loss_function calls logits.float()).
func hfSetup(dtype string, dropout float64, seq int64) ir.Setup {
	s := ir.DefaultSetup()
	s.DType, s.Dropout, s.Seq = dtype, dropout, seq
	s.Profile, s.Attention, s.Numerics.LogitsFP32 = "transformers", "sdpa", true
	s.Transformers = "5.24"
	s.Numerics.ByteMasks, s.Numerics.SDPAGQA, s.Numerics.ModelMasks = true, true, true
	s.Numerics.GPT2FloatScale, s.Numerics.GPT2AdditiveMask, s.Numerics.Phi3RopeCat = true, true, true
	s.Numerics.GemmaScaleBuffer = true
	s.LoRA.Targets = []ir.LoRATarget{"q", "v"} // PEFT's default for Llama and its kin
	return s
}

// gpt2Setup is hfSetup for GPT-2, whose eager attention takes its softmax
// in the model dtype (GPT2Attention._attn without reorder_and_upcast_attn).
func gpt2Setup(dtype string, dropout float64, seq int64) ir.Setup {
	s := hfSetup(dtype, dropout, seq)
	s.Numerics.SoftmaxFP32 = false
	s.LoRA.Targets = []ir.LoRATarget{"q", "k", "v"} // PEFT's default: c_attn
	return s
}

func TestParseHFConfigFiles(t *testing.T) {
	tests := []struct {
		file string
		want *Model
	}{
		{"llama-3-8b.json", &Model{
			Name: "llama-3-8b", Family: "llama", Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8,
			FFN: 14336, Vocab: 128256, NormEps: 1e-5, RopeTheta: 500000, MaxSeq: 8192,
			Training: hfSetup("bf16", 0, 8192),
		}},
		{"mistral-7b.json", &Model{
			Name: "mistral-7b", Family: "llama", Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8,
			FFN: 14336, Vocab: 32000, NormEps: 1e-5, RopeTheta: 10000, MaxSeq: 32768, SlidingWindow: 4096,
			Training: hfSetup("bf16", 0, 8192),
		}},
		{"qwen2-1.5b.json", &Model{
			Name: "qwen2-1.5b", Family: "llama", Layers: 28, Hidden: 1536, Heads: 12, KVHeads: 2,
			FFN: 8960, Vocab: 151936, TiedEmbeddings: true, QKVBias: true, NormEps: 1e-6,
			RopeTheta: 1000000, MaxSeq: 131072,
			Training: hfSetup("bf16", 0, 8192),
		}},
		{"gpt2.json", &Model{
			Name: "gpt2", Family: "gpt2", Layers: 12, Hidden: 768, Heads: 12, KVHeads: 12,
			FFN: 3072, Vocab: 50257, TiedEmbeddings: true, QKVBias: true, NormEps: 1e-5, MaxSeq: 1024,
			Training: gpt2Setup("bf16", 0.1, 1024),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "hf", tt.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseHFConfig(path, data)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseHFConfig(%s) (-want +got)\n%s", path, diff)
			}
		})
	}
}

// TestParseHFConfigKeys checks one mapping rule at a time on small
// configs.
func TestParseHFConfigKeys(t *testing.T) {
	const llama = `"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100`
	const gpt2 = `"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100`
	small := func(family string, edit func(*Model)) *Model {
		m := &Model{Name: "config", Family: family, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 4,
			FFN: 128, Vocab: 100, NormEps: 1e-5, Training: hfSetup("bf16", 0, 2048)}
		if family == "llama" {
			m.RopeTheta = 10000
		} else {
			m.FFN = 256
			m.TiedEmbeddings, m.QKVBias = true, true
			m.Training = gpt2Setup("bf16", 0.1, 2048)
		}
		edit(m)
		if m.Experts > 0 {
			// transformers 4.57, the newest whose experts ckptplan
			// models: GPT-2's attention as before 5.2, Gemma's
			// embedding scale as before 5.4.
			m.Training.Transformers = "4.57"
			m.Training.Numerics.GPT2FloatScale, m.Training.Numerics.GPT2AdditiveMask = false, false
			m.Training.Numerics.GemmaScaleBuffer = false
		}
		return m
	}
	tests := []struct {
		name, json string
		want       *Model
	}{
		{"llama defaults", `{` + llama + `}`, small("llama", func(m *Model) {})},
		{"name_or_path", `{"_name_or_path": "meta-llama/Meta-Llama-3-8B", ` + llama + `}`,
			small("llama", func(m *Model) { m.Name = "meta-llama/Meta-Llama-3-8B" })},
		// A checkpoint saved in fp32 or fp16 still trains in bf16 by default.
		{"float32 checkpoint", `{"torch_dtype": "float32", ` + llama + `}`, small("llama", func(m *Model) {})},
		{"float16 as dtype", `{"dtype": "float16", ` + llama + `}`, small("llama", func(m *Model) {})},
		// Sliding windows: MistralConfig's 4096 when left out, none when
		// null; Qwen2's from max_window_layers on, only when switched on.
		{"mistral window default", `{` + strings.Replace(llama, `"llama"`, `"mistral"`, 1) + `}`,
			small("llama", func(m *Model) { m.SlidingWindow = 4096 })},
		{"mistral window null", `{"sliding_window": null, ` + strings.Replace(llama, `"llama"`, `"mistral"`, 1) + `}`,
			small("llama", func(m *Model) {})},
		{"qwen2 window off", `{"sliding_window": 8, ` + strings.Replace(llama, `"llama"`, `"qwen2"`, 1) + `}`,
			small("llama", func(m *Model) { m.QKVBias = true })},
		{"qwen2 window on but null", `{"use_sliding_window": true, "sliding_window": null, "max_window_layers": 1, ` + strings.Replace(llama, `"llama"`, `"qwen2"`, 1) + `}`,
			small("llama", func(m *Model) { m.QKVBias = true })},
		{"qwen2 window on", `{"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1, ` + strings.Replace(llama, `"llama"`, `"qwen2"`, 1) + `}`,
			small("llama", func(m *Model) { m.QKVBias, m.SlidingWindow, m.SlidingFrom = true, 8, 1 })},
		{"llama attention_bias", `{"attention_bias": true, ` + llama + `}`,
			small("llama", func(m *Model) { m.QKVBias, m.OBias = true, true })},
		{"llama mlp_bias", `{"mlp_bias": true, ` + llama + `}`,
			small("llama", func(m *Model) { m.MLPBias = true })},
		{"head_dim of its own", `{"head_dim": 32, ` + llama + `}`,
			small("llama", func(m *Model) { m.HeadSize = 32 })},
		{"mistral ignores attention_bias", `{` + strings.Replace(llama, `"llama"`, `"mistral"`, 1) + `, "attention_bias": true}`,
			small("llama", func(m *Model) { m.SlidingWindow = 4096 })},
		{"qwen2 biases qkv, ties nothing by default", `{` + strings.Replace(llama, `"llama"`, `"qwen2"`, 1) + `}`,
			small("llama", func(m *Model) { m.QKVBias = true })},
		{"kv heads and dropout", `{"num_key_value_heads": 2, "attention_dropout": 0.05, ` + llama + `}`,
			small("llama", func(m *Model) { m.KVHeads, m.Training.Dropout = 2, 0.05 })},
		{"head_dim that agrees", `{"head_dim": 16, ` + llama + `}`, small("llama", func(m *Model) {})},
		{"short context", `{"max_position_embeddings": 512, ` + llama + `}`,
			small("llama", func(m *Model) { m.MaxSeq, m.Training.Seq = 512, 512 })},
		{"long context capped", `{"max_position_embeddings": 1048576, ` + llama + `}`,
			small("llama", func(m *Model) { m.MaxSeq, m.Training.Seq = 1048576, 8192 })},
		{"JSON escapes and nesting", `{"a\/b": "\ud83d\ude00", "rope_scaling": {"type": "linear", "factor": [2.0]}, ` + llama + `}`,
			small("llama", func(m *Model) {})},
		{"integral float", `{"num_hidden_layers": 2.0, ` + strings.Replace(llama, `"num_hidden_layers": 2, `, "", 1) + `}`,
			small("llama", func(m *Model) {})},
		// GraniteConfig's defaults: ε = 1e-6, every multiplier 1.
		{"granite defaults", `{` + strings.Replace(llama, `"llama"`, `"granite"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Family, m.NormEps = "granite", 1e-6
				m.Training.LoRA.Targets = []ir.LoRATarget{"q", "k", "v", "o"} // no PEFT default: every attention projection
				m.EmbeddingMultiplier, m.ResidualMultiplier, m.AttentionMultiplier, m.LogitsScaling = 1, 1, 1, 1
			})},
		{"granite multipliers and biases", `{"embedding_multiplier": 12, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 8, "attention_bias": true, "mlp_bias": true, ` +
			strings.Replace(llama, `"llama"`, `"granite"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Family, m.NormEps, m.QKVBias, m.OBias, m.MLPBias = "granite", 1e-6, true, true, true
				m.Training.LoRA.Targets = []ir.LoRATarget{"q", "k", "v", "o"}
				m.EmbeddingMultiplier, m.ResidualMultiplier, m.AttentionMultiplier, m.LogitsScaling = 12, 0.22, 0.0078125, 8
			})},
		// Gemma2Config's defaults: 4 kv heads of 256, tied, ε = 1e-6,
		// scores capped at 50, logits at 30, queries scaled by 1/√256,
		// windows of 4096; null turns a cap, the scale or the window off.
		{"gemma2 defaults", `{` + strings.Replace(llama, `"llama"`, `"gemma2"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Family, m.KVHeads, m.HeadSize, m.TiedEmbeddings, m.NormEps = "gemma2", 4, 256, true, 1e-6
				m.AttnSoftcap, m.FinalSoftcap, m.QueryScalar, m.SlidingWindow = 50, 30, 256, 4096
				m.Training.Attention = "eager" // transformers 5.21 and later run no sdpa with soft-capping
			})},
		{"gemma2 nulls", `{"attn_logit_softcapping": null, "final_logit_softcapping": null, "query_pre_attn_scalar": null, "sliding_window": null, "num_key_value_heads": 4, "head_dim": 16, ` +
			strings.Replace(llama, `"llama"`, `"gemma2"`, 1) + `}`,
			small("llama", func(m *Model) { m.Family, m.TiedEmbeddings, m.NormEps = "gemma2", true, 1e-6 })},
		{"gemma2 values", `{"attn_logit_softcapping": 20, "final_logit_softcapping": 10.5, "query_pre_attn_scalar": 144, "sliding_window": 512, "attention_bias": true, ` +
			strings.Replace(llama, `"llama"`, `"gemma2"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Family, m.KVHeads, m.HeadSize, m.TiedEmbeddings, m.NormEps = "gemma2", 4, 256, true, 1e-6
				m.AttnSoftcap, m.FinalSoftcap, m.QueryScalar, m.SlidingWindow = 20, 10.5, 144, 512
				m.QKVBias, m.OBias = true, true
				m.Training.Attention = "eager"
			})},
		// Qwen3Config's: heads of 128, ε = 1e-6; attention_bias biases
		// q, k, v and o.
		{"qwen3 defaults", `{` + strings.Replace(llama, `"llama"`, `"qwen3"`, 1) + `}`,
			small("llama", func(m *Model) { m.Family, m.HeadSize, m.NormEps = "qwen3", 128, 1e-6 })},
		{"qwen3 biases, no sliding window", `{"attention_bias": true, "use_sliding_window": false, "sliding_window": 4096, "head_dim": 16, ` +
			strings.Replace(llama, `"llama"`, `"qwen3"`, 1) + `}`,
			small("llama", func(m *Model) { m.Family, m.NormEps, m.QKVBias, m.OBias = "qwen3", 1e-6, true, true })},
		// MixtralConfig's: 8 experts, 2 a token, renormalized; every
		// layer routes.
		{"mixtral defaults", `{` + strings.Replace(llama, `"llama"`, `"mixtral"`, 1) + `}`,
			small("llama", func(m *Model) { m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.NormTopK = 8, 2, 128, true })},
		{"mixtral experts", `{"num_local_experts": 4, "num_experts_per_tok": 1, "router_jitter_noise": 0, "output_router_logits": false, ` +
			strings.Replace(llama, `"llama"`, `"mixtral"`, 1) + `}`,
			small("llama", func(m *Model) { m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.NormTopK = 4, 1, 128, true })},
		// Qwen2MoeConfig's: 60 experts of 1408, 4 a token, not
		// renormalized, a shared expert of 5632, biased q, k, v, ε 1e-6.
		{"qwen2_moe defaults", `{` + strings.Replace(llama, `"llama"`, `"qwen2_moe"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.SharedExpertFFN = 60, 4, 1408, 5632
				m.QKVBias, m.NormEps = true, 1e-6
			})},
		// A layer is dense when mlp_only_layers lists it or
		// decoder_sparse_step skips it: (l+1) % step != 0.
		{"qwen2_moe dense layers", `{"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 0, "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [0], "num_hidden_layers": 4, ` +
			strings.Replace(strings.Replace(llama, `"llama"`, `"qwen2_moe"`, 1), `"num_hidden_layers": 2, `, "", 1) + `}`,
			small("llama", func(m *Model) {
				m.Layers, m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.NormTopK = 4, 4, 2, 32, true
				m.DenseLayers, m.QKVBias, m.NormEps = []int64{0, 2}, true, 1e-6
			})},
		// Qwen3MoeConfig's: Qwen 3's heads of 128, 128 experts of 768, 8 a
		// token, not renormalized unless norm_topk_prob says so.
		{"qwen3_moe defaults", `{` + strings.Replace(llama, `"llama"`, `"qwen3_moe"`, 1) + `}`,
			small("llama", func(m *Model) {
				m.Family, m.HeadSize, m.NormEps = "qwen3", 128, 1e-6
				m.Experts, m.ExpertsPerToken, m.ExpertFFN = 128, 8, 768
			})},
		{"gpt2 defaults", `{` + gpt2 + `}`, small("gpt2", func(m *Model) {})},
		{"gpt2 n_inner null", `{"n_inner": null, ` + gpt2 + `}`, small("gpt2", func(m *Model) {})},
		{"gpt2 n_inner", `{"n_inner": 100, ` + gpt2 + `}`, small("gpt2", func(m *Model) { m.FFN = 100 })},
		{"gpt2 untied", `{"tie_word_embeddings": false, ` + gpt2 + `}`,
			small("gpt2", func(m *Model) { m.TiedEmbeddings = false })},
		{"gpt2 attn_pdrop first", `{"resid_pdrop": 0.2, "attn_pdrop": 0.0, ` + gpt2 + `}`,
			small("gpt2", func(m *Model) { m.Training.Dropout = 0 })},
		{"gpt2 resid_pdrop alone", `{"resid_pdrop": 0.2, ` + gpt2 + `}`,
			small("gpt2", func(m *Model) { m.Training.Dropout = 0.2 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHFConfig("some/dir/config.json", []byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestParseHFConfigErrors(t *testing.T) {
	tests := []struct{ name, json, want string }{
		{"empty", " \n", "x.json: empty file"},
		{"string root", `"llama"`, `x.json:1:1: want a JSON object (a config.json), got the string "llama"`},
		{"null root", "\n  null", "x.json:2:3: want a JSON object (a config.json), got null"},
		{"garbage after", `{"model_type": "gpt2"} x`, "x.json:1:24: invalid character 'x' after top-level value"},
		{"unterminated string", "{\"model_type\": \"gpt", "x.json:1:20: unexpected end of JSON input"},
		{"columns count runes", `{"é": 1, "model_type": 7}`, `x.json:1:24: no builder for model_type "7"`},
		{"how to trace", `{"model_type": "olmo"}`, `x.json:1:16: no builder for model_type "olmo" (ckptplan builds gemma, gemma2, gpt2, granite, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, starcoder2); trace it with the Python package, which builds the model on no memory and writes a graph to plan: 'pip install ./python' from a clone of ckptplan (or its wheel) then 'ckptplan trace x.json -o model.yaml'`},
		{"duplicate key", "{\"model_type\": \"gpt2\",\n \"model_type\": \"gpt2\"}", `x.json:2:2: duplicate key "model_type"`},
		{"negative rope_theta", `{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "rope_theta": -1}`,
			"x.json:1:153: rope_theta: must be positive, got -1"},
		{"odd head size", `{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 60, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}`,
			"x.json:1:91: num_attention_heads: head size 15 is odd"},
		{"granite negative multiplier", `{"model_type": "granite", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "residual_multiplier": -0.5}`,
			"x.json:1:164: residual_multiplier: must be positive and finite, got -0.5"},
		{"gemma2 zero softcap", `{"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "final_logit_softcapping": 0}`,
			"x.json:1:167: final_logit_softcapping: must be positive, got 0 (null for none)"},
		{"gemma2 negative window", `{"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "sliding_window": -8}`,
			"x.json:1:158: sliding_window: must be positive, got -8 (null for none)"},
		{"mistral zero window", `{"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "sliding_window": 0}`,
			"x.json:1:159: sliding_window: must be positive, got 0 (null for none)"},
		{"qwen2_moe sliding window", `{"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "use_sliding_window": true}`,
			"x.json:1:165: use_sliding_window: sliding-window layers of a qwen2_moe model are not modelled"},
		{"qwen3 sliding window", `{"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "use_sliding_window": true}`,
			"x.json:1:161: use_sliding_window: sliding-window layers of a qwen3 model are not modelled"},
		{"gpt2 bool layers", `{"model_type": "gpt2", "n_layer": true, "n_embd": 64, "n_head": 4, "vocab_size": 100}`,
			`x.json:1:35: n_layer: want an integer, got "true"`},
		{"zero context", `{"model_type": "gpt2", "n_positions": 0, "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}`,
			"x.json:1:39: n_positions: must be positive, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseHFConfig("x.json", []byte(tt.json))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant it to start with %q", err, tt.want)
			}
		})
	}
}

// TestParseHFConfigExpertErrors checks that a mixture of experts'
// config is refused where it is wrong or not modelled, at the value.
func TestParseHFConfigExpertErrors(t *testing.T) {
	const base = `"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100`
	tests := []struct {
		name, typ, key, value, want string
		inner                       int // columns from the value to the error: an element of a list
	}{
		{"dense type with experts", "mistral", "num_local_experts", "8", "num_local_experts: 8 experts: a mistral has no mixture of experts", 0},
		{"qwen2 with experts", "qwen2", "num_experts", "60", "num_experts: 60 experts: a qwen2 has no mixture of experts", 0},
		{"no experts", "mixtral", "num_local_experts", "0", "num_local_experts: must be positive, got 0", 0},
		{"negative experts", "qwen3_moe", "num_experts", "-2", "num_experts: must be positive, got -2", 0},
		{"more per token than experts", "mixtral", "num_experts_per_tok", "9", "num_experts_per_tok: must be between 1 and experts (8), got 9", 0},
		{"none per token", "qwen2_moe", "num_experts_per_tok", "0", "num_experts_per_tok: must be between 1 and experts (60), got 0", 0},
		{"jitter", "mixtral", "router_jitter_noise", "0.01", "router_jitter_noise: 0.01: the router's jitter", 0},
		{"aux loss", "qwen2_moe", "output_router_logits", "true", "output_router_logits: true: the router's auxiliary load-balancing loss", 0},
		{"zero sparse step", "qwen3_moe", "decoder_sparse_step", "0", "decoder_sparse_step: must be positive, got 0", 0},
		{"dense layer out of range", "qwen2_moe", "mlp_only_layers", "[0, 5]", "mlp_only_layers[1]: layer 5 is not one of the model's 2", 0},
		{"dense layers of strings", "qwen2_moe", "mlp_only_layers", `["0"]`, `mlp_only_layers[0]: want an integer, got "0"`, 1},
		{"negative expert size", "qwen3_moe", "moe_intermediate_size", "-1", "moe_intermediate_size: must be positive, got -1", 0},
		{"qwen3_moe sliding window", "qwen3_moe", "use_sliding_window", "true", "use_sliding_window: sliding-window layers of a qwen3_moe model are not modelled", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := `{"model_type": "` + tt.typ + `", ` + base + `, "` + tt.key + `": ` + tt.value + `}`
			col := strings.Index(doc, `"`+tt.key+`": `) + len(tt.key) + 4 + 1 + tt.inner // the value's column
			want := fmt.Sprintf("x.json:1:%d: %s", col, tt.want)
			_, err := ParseHFConfig("x.json", []byte(doc))
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error = %v\nwant it to start with %q", err, want)
			}
		})
	}
}

// TestHFConfigMatchesBundled checks that a Hugging Face config.json gives
// the same model and graph as the bundled description of the same model,
// once both train the same way.
func TestHFConfigMatchesBundled(t *testing.T) {
	for _, name := range []string{"llama-3-8b", "mistral-7b", "qwen2-1.5b", "gpt2"} {
		t.Run(name, func(t *testing.T) {
			hf, err := Load("testdata/hf/" + name + ".json")
			if err != nil {
				t.Fatal(err)
			}
			bundled, err := Load(name)
			if err != nil {
				t.Fatal(err)
			}
			// The training setup is the bundled file's choice and the name
			// its own; the architecture must agree.
			hf.Model.Training = bundled.Model.Training
			hf.Model.Name = bundled.Model.Name
			if diff := cmp.Diff(bundled.Model, hf.Model); diff != "" {
				t.Errorf("model from config.json differs from the bundled one (-bundled +hf)\n%s", diff)
			}
			a, err := Build(hf.Model)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Build(bundled.Model)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b, a, cmpopts.IgnoreUnexported(ir.Graph{})); diff != "" {
				t.Errorf("graph from config.json differs from the bundled one (-bundled +hf)\n%s", diff)
			}
		})
	}
}

func FuzzParseHFConfig(f *testing.F) {
	addSeeds(f, "testdata/hf/*.json", "testdata/bad/hf-*.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseHFConfig("config.json", data)
		if err != nil {
			if _, ok := err.(*PosError); !ok {
				t.Fatalf("error %q is a %T, want a *PosError", err, err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("ParseHFConfig returned a model that does not validate: %v", err)
		}
		m.Training.Seq = min(m.Training.Seq, 64)
		m.Layers = min(m.Layers, 2)
		_, _ = Build(m)
	})
}

func FuzzParseModel(f *testing.F) {
	addSeeds(f, "../models/*.yaml", "testdata/bad/model-*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := Parse("model.yaml", data)
		if err == nil && src.Kind == KindModel {
			src.Model.Layers = min(src.Model.Layers, 2)
			_, _ = Build(src.Model)
		}
	})
}

// TestCheckJSONKeys: a key given twice in any object of a document is
// refused at its place; the same key in different objects, in arrays of
// objects, or as a string value is not a duplicate.
func TestCheckJSONKeys(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{`{"a": 1, "b": 2}`, ""},
		{`{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "c": "a"}`, ""},
		{`[{"x": 1}, {"x": 2, "y": [1, {"x": 3}]}]`, ""},
		{"{\"feasible\": false,\n \"feasible\": true}", `p.json:2:2: duplicate key "feasible"`},
		{`{"s": [{"k": 1, "k": 2}]}`, `p.json:1:17: duplicate key "k"`},
		{`{"o": {"x": {}, "y": [], "x": 1}}`, `p.json:1:26: duplicate key "x"`},
		{`{"budget_bytes": 5, "Budget_Bytes": 4}`, `p.json:1:21: duplicate key "Budget_Bytes"`},
	} {
		err := CheckJSONKeys("p.json", []byte(tt.doc))
		if got := fmt.Sprint(err); tt.want == "" && err != nil || tt.want != "" && got != tt.want {
			t.Errorf("%s: %v, want %q", tt.doc, err, tt.want)
		}
	}
}
