package planner

import (
	"fmt"
	"testing"
)

func TestKeepSetWords(t *testing.T) {
	keep := func(names ...string) []SavedTensor {
		out := make([]SavedTensor, len(names))
		for i, n := range names {
			out[i] = SavedTensor{Name: "layers.3." + n, Keep: true}
		}
		return out
	}
	drop := func(names ...string) []SavedTensor {
		out := keep(names...)
		for i := range out {
			out[i].Keep = false
		}
		return out
	}
	cat := func(s ...[]SavedTensor) []SavedTensor {
		var out []SavedTensor
		for _, x := range s {
			out = append(out, x...)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		saved []SavedTensor
		want  string
	}{
		{"sdpa and the MLP's products",
			cat(drop("input_layernorm:rstd", "attn.q_proj"), keep("attn.rope_k", "attn.sdpa", "attn.sdpa:logsumexp", "attn.sdpa:rng_state"),
				drop("attn.o_proj:lora_input", "post_attention_layernorm:x_fp32"), keep("mlp.gate_proj", "mlp.up_proj"), drop("mlp.silu", "mlp.mul")),
			"keeps the attention's rotated keys and output, and the MLP's gate and up projections"},
		{"fewer dropped than kept",
			cat(keep("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.sdpa", "attn.o_proj"), drop("mlp.silu", "mlp.mul")),
			"recomputes the MLP's activation and gated product"},
		{"everything", keep("attn.sdpa", "mlp.up_proj"), "keeps everything"},
		{"nothing", drop("attn.sdpa", "mlp.up_proj"), "recomputes everything"},
		{"LoRA", cat(keep("attn.q_proj:lora_input", "attn.q_proj:lora_a", "attn.v_proj:lora_input", "attn.v_proj:lora_a"), drop("attn.sdpa", "mlp.silu", "mlp.mul")),
			"keeps the LoRA adapters' inputs and hidden states"},
		{"eager attention's copies", cat(keep("attn.qk_matmul:copy0", "attn.qk_matmul:copy1", "attn.av_matmul:copy1"), drop("attn.softmax", "attn.attn_dropout:mask", "mlp.fc1", "mlp.gelu")),
			"keeps the attention's query, key and value copies"},
		{"norms and the residual", cat(keep("input_layernorm:rstd", "input_layernorm:x_fp32", "resid_1", "pre_feedforward_layernorm:rstd"), drop("attn.sdpa", "attn.o_proj", "mlp.down_proj", "mlp.up_proj", "mlp.gate_proj")),
			"keeps the input norm, the residual sum and the pre-MLP norm"},
		{"experts", cat(keep("moe.softmax", "moe.experts.gate_proj", "moe.experts.up_proj"), drop("moe.experts.silu", "moe.experts.mul", "moe.route_weights", "attn.sdpa")),
			"keeps the router's probabilities and the experts' gate and up projections"},
		{"a name it does not know", cat(keep("attn.flux_capacitor", "mystery"), drop("attn.sdpa", "mlp.silu", "mlp.mul")),
			"keeps attn.flux_capacitor and mystery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := KeepSet{Saved: tc.saved}
			if got := k.Words("layers.3"); got != tc.want {
				t.Errorf("Words\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func ExampleKeepSet_Words() {
	k := KeepSet{Name: "keep(attn.sdpa,attn.sdpa:logsumexp,mlp.gate_proj,mlp.up_proj)", Saved: []SavedTensor{
		{Name: "layers.0.attn.q_proj"}, {Name: "layers.0.attn.sdpa", Keep: true}, {Name: "layers.0.attn.sdpa:logsumexp", Keep: true},
		{Name: "layers.0.attn.o_proj"}, {Name: "layers.0.mlp.gate_proj", Keep: true}, {Name: "layers.0.mlp.up_proj", Keep: true},
		{Name: "layers.0.mlp.silu"}, {Name: "layers.0.mlp.mul"},
	}}
	fmt.Println(k.Words("layers.0"))
	// Output: keeps the attention's output and the MLP's gate and up projections
}
