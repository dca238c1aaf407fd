package graphio

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
)

// The readers of each model family's config.json: the keys its
// transformers configuration class reads, and what they mean for the
// model ckptplan builds.

func (r *hfRead) llama(m *Model, modelType string) error {
	var c hfLlama
	if err := r.d.decode(r.root, reflect.ValueOf(&c).Elem(), ""); err != nil {
		return err
	}
	if err := r.required("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"); err != nil {
		return err
	}
	switch modelType {
	case "gemma":
		// GemmaConfig's defaults, where Llama's differ: 16 kv heads of
		// 256, tied embeddings, ε = 1e-6.
		m.KVHeads, m.HeadSize, m.TiedEmbeddings, m.NormEps = 16, 256, true, 1e-6
	case "gemma2":
		// Gemma2Config's: 4 kv heads of 256, queries scaled by 1/√256,
		// scores capped at 50 and logits at 30, windows of 4096.
		m.KVHeads, m.HeadSize, m.TiedEmbeddings, m.NormEps = 4, 256, true, 1e-6
		m.QueryScalar, m.AttnSoftcap, m.FinalSoftcap, m.SlidingWindow = 256, 50, 30, 4096
	case "starcoder2":
		// Starcoder2Config's: 2 kv heads, biases everywhere, and
		// PretrainedConfig's tied embeddings.
		m.KVHeads, m.TiedEmbeddings, m.QKVBias, m.OBias, m.MLPBias = 2, true, true, true, true
	case "granite":
		m.NormEps = 1e-6 // GraniteConfig's
	case "qwen3":
		m.HeadSize, m.NormEps = 128, 1e-6 // Qwen3Config's
	case "mixtral":
		// MixtralConfig's: 8 experts, 2 per token, their weights
		// renormalized.
		m.Experts, m.ExpertsPerToken, m.NormTopK = 8, 2, true
	case "qwen2_moe":
		// Qwen2MoeConfig's: 60 experts of 1408, 4 per token, a shared
		// expert of 5632, biases on q, k and v.
		m.Experts, m.ExpertsPerToken, m.ExpertFFN, m.SharedExpertFFN, m.QKVBias = 60, 4, 1408, 5632, true
		m.NormEps = 1e-6
	case "qwen3_moe":
		// Qwen3MoeConfig's: Qwen 3's attention, 128 experts of 768, 8 per
		// token.
		m.HeadSize, m.NormEps = 128, 1e-6
		m.Experts, m.ExpertsPerToken, m.ExpertFFN = 128, 8, 768
	}
	setField(r, &m.Layers, c.Layers, "layers", "num_hidden_layers")
	setField(r, &m.Hidden, c.Hidden, "hidden", "hidden_size")
	setField(r, &m.Heads, c.Heads, "heads", "num_attention_heads")
	setField(r, &m.KVHeads, c.KVHeads, "kv_heads", "num_key_value_heads")
	if c.KVHeads != nil && *c.KVHeads == 0 {
		return r.fieldError(&ir.FieldError{Field: "kv_heads", Msg: "must be positive, got 0 (leave it out for as many as the attention heads)"})
	}
	setField(r, &m.FFN, c.FFN, "ffn", "intermediate_size")
	setField(r, &m.Vocab, c.Vocab, "vocab", "vocab_size")
	setField(r, &m.NormEps, c.NormEps, "norm_eps", "rms_norm_eps")
	setField(r, &m.RopeTheta, c.RopeTheta, "rope_theta", "rope_theta")
	setField(r, &m.Training.Dropout, c.Dropout, "training.dropout", "attention_dropout")
	setField(r, &m.TiedEmbeddings, c.Tied, "tied_embeddings", "tie_word_embeddings")
	if err := r.experts(&c, m, modelType); err != nil {
		return err
	}
	if err := r.activation(&c, modelType); err != nil {
		return err
	}
	switch modelType {
	case "llama", "gemma", "gemma2", "granite", "qwen3", "qwen3_moe":
		// LlamaAttention, GemmaAttention, Gemma2Attention,
		// GraniteAttention and Qwen3Attention bias q, k, v and o alike;
		// LlamaMLP and GraniteMLP their three projections (Gemma's and
		// Qwen 3's MLPs have none).
		setField(r, &m.QKVBias, c.AttentionBias, "qkv_bias", "attention_bias")
		setField(r, &m.OBias, c.AttentionBias, "o_bias", "attention_bias")
		if modelType == "llama" || modelType == "granite" {
			setField(r, &m.MLPBias, c.MLPBias, "mlp_bias", "mlp_bias")
		}
		if modelType == "gemma2" {
			if err := r.gemma2(&c, m); err != nil {
				return err
			}
		}
		if modelType == "granite" {
			if err := r.granite(&c, m); err != nil {
				return err
			}
		}
		if strings.HasPrefix(modelType, "qwen3") && c.UseSlidingWindow != nil && *c.UseSlidingWindow {
			return r.d.errField("use_sliding_window", "use_sliding_window: sliding-window layers of a %s model are not modelled (transformers passes their mask to every layer's attention); set it to false to plan the model with full attention", modelType)
		}
	case "qwen2", "qwen2_moe":
		m.QKVBias = true // Qwen2Attention (and Qwen2MoeAttention) always biases q, k and v
		if c.UseSlidingWindow != nil && *c.UseSlidingWindow {
			if modelType == "qwen2_moe" {
				// Its layers slide by a rule of their own, which changed
				// in 5.0; not modelled.
				return r.d.errField("use_sliding_window", "use_sliding_window: sliding-window layers of a qwen2_moe model are not modelled; set it to false to plan the model with full attention")
			}
			if err := r.slidingWindow(&c, m, 4096); err != nil {
				return err
			}
			if c.MaxWindowLayers != nil && *c.MaxWindowLayers < 0 {
				return r.d.errField("max_window_layers", "max_window_layers: must be a layer count, got %d", *c.MaxWindowLayers)
			}
			if m.SlidingWindow > 0 {
				m.SlidingFrom = 28 // Qwen2Config's max_window_layers
				setField(r, &m.SlidingFrom, c.MaxWindowLayers, "sliding_from", "max_window_layers")
			}
		}
	case "mistral", "mixtral":
		// MistralConfig's window is 4096 tokens, Mixtral's none.
		def := int64(0)
		if modelType == "mistral" {
			def = 4096
		}
		if err := r.slidingWindow(&c, m, def); err != nil {
			return err
		}
	case "phi3":
		if err := r.phi3(&c, m); err != nil {
			return err
		}
	case "starcoder2":
		if err := r.starcoder2(&c, m); err != nil {
			return err
		}
	}
	if m.RopeTheta < 0 {
		return r.d.errField("rope_theta", "rope_theta: must be positive, got %v", m.RopeTheta)
	}
	r.maxPos(m, c.MaxPos, "max_position_embeddings")
	if c.HeadDim != nil && modelType != "phi3" { // Phi3Attention's is always hidden/heads
		if *c.HeadDim <= 0 {
			return r.d.errField("head_dim", "head_dim: must be positive, got %d", *c.HeadDim)
		}
		m.HeadSize = *c.HeadDim
	}
	if m.HeadSize > 0 && m.Heads > 0 && m.Hidden%m.Heads == 0 && m.HeadSize == m.Hidden/m.Heads {
		m.HeadSize = 0 // hidden/heads
	}
	r.keys["head_dim"] = "head_dim"
	return nil
}

// hfMoETypes are the model types whose MLP is a mixture of experts, and
// the key each names its number of experts by.
var hfMoETypes = map[string]string{"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts"}

// experts reads a mixture of experts: its experts and how many each token
// goes to, their size, the shared expert, whether the chosen weights are
// renormalized, and which layers keep a dense MLP (Qwen's
// mlp_only_layers, and those decoder_sparse_step skips). A dense model
// type with experts is refused (it would be another model), as are the
// router's jitter (a random tensor per layer kept for backward) and its
// auxiliary loss, which are not modelled.
func (r *hfRead) experts(c *hfLlama, m *Model, modelType string) error {
	key, moe := hfMoETypes[modelType]
	if !moe {
		for _, e := range []struct {
			n   *int64
			key string
		}{{c.LocalExperts, "num_local_experts"}, {c.Experts, "num_experts"}, {c.RoutedExperts, "n_routed_experts"}} {
			if e.n != nil && *e.n > 1 {
				return r.d.errField(e.key, "%s: %d experts: a %s has no mixture of experts, and without them this would be another model (model types with experts: %s)", e.key, *e.n, modelType, strings.Join(slices.Sorted(maps.Keys(hfMoETypes)), ", "))
			}
		}
		return nil
	}
	n := c.Experts
	if modelType == "mixtral" {
		n = c.LocalExperts
	}
	if n != nil && *n <= 0 {
		return r.d.errField(key, "%s: must be positive, got %d", key, *n)
	}
	setField(r, &m.Experts, n, "experts", key)
	setField(r, &m.ExpertsPerToken, c.ExpertsPerTok, "experts_per_token", "num_experts_per_tok")
	if modelType != "mixtral" {
		setField(r, &m.ExpertFFN, c.ExpertFFN, "expert_ffn", "moe_intermediate_size")
		setField(r, &m.NormTopK, c.NormTopK, "norm_topk", "norm_topk_prob")
	}
	if modelType == "qwen2_moe" {
		setField(r, &m.SharedExpertFFN, c.SharedFFN, "shared_expert_ffn", "shared_expert_intermediate_size")
	}
	if c.RouterJitter != nil && *c.RouterJitter != 0 {
		return r.d.errField("router_jitter_noise", "router_jitter_noise: %v: the router's jitter (a random tensor each layer keeps for backward) is not modelled; plan with 0", *c.RouterJitter)
	}
	if c.RouterLogits != nil && *c.RouterLogits {
		return r.d.errField("output_router_logits", "output_router_logits: true: the router's auxiliary load-balancing loss (which holds every layer's router logits) is not modelled; plan with false")
	}
	if modelType == "mixtral" {
		return nil
	}
	step := int64(1)
	if c.SparseStep != nil {
		if step = *c.SparseStep; step <= 0 {
			return r.d.errField("decoder_sparse_step", "decoder_sparse_step: must be positive, got %d", step)
		}
	}
	r.keys["dense_layers"] = "mlp_only_layers"
	if m.Layers > maxLayers {
		return nil // Validate says so
	}
	for l := int64(0); l < m.Layers; l++ {
		if slices.Contains(c.MLPOnly, l) || (l+1)%step != 0 {
			m.DenseLayers = append(m.DenseLayers, l)
		}
	}
	for i, l := range c.MLPOnly {
		if l < 0 || l >= m.Layers {
			return r.d.errField("mlp_only_layers", "mlp_only_layers[%d]: layer %d is not one of the model's %d", i, l, m.Layers)
		}
	}
	return nil
}

// activation checks the MLP's activation: SiLU for the Llama family and
// Phi-3, GELU's tanh approximation for StarCoder2; for Gemma hidden_activation, GELU's tanh approximation when null
// (transformers then ignores hidden_act).
func (r *hfRead) activation(c *hfLlama, modelType string) error {
	key, v, want := "hidden_act", c.Act, "silu"
	switch modelType {
	case "gemma", "gemma2":
		key, v, want = "hidden_activation", c.Activation, "gelu_pytorch_tanh"
	case "starcoder2":
		want = "gelu_pytorch_tanh"
	}
	if v != nil && *v != want {
		return r.d.errField(key, "%s: %q is not modelled: a %s MLP is planned with %s", key, *v, modelType, want)
	}
	return nil
}

// phi3 reads what Phi-3 adds: the dropout of both residual branches, which
// the setup's one rate must also describe, and refuses a rotary embedding
// over part of a head.
func (r *hfRead) phi3(c *hfLlama, m *Model) error {
	if c.PartialRotary != nil && *c.PartialRotary != 1 {
		return r.d.errField("partial_rotary_factor", "partial_rotary_factor: %v: rotary embeddings over part of a head are not planned yet", *c.PartialRotary)
	}
	if err := r.slidingWindow(c, m, 0); err != nil {
		return err
	}
	return r.dropoutRates(m, c.Dropout, hfRate{c.ResidDropout, "resid_pdrop"})
}

// starcoder2 reads StarCoder2's names for the norms' ε and the biases,
// and its three dropout rates, which the setup's one rate must describe.
func (r *hfRead) starcoder2(c *hfLlama, m *Model) error {
	setField(r, &m.NormEps, c.NormEpsilon, "norm_eps", "norm_epsilon")
	setField(r, &m.QKVBias, c.UseBias, "qkv_bias", "use_bias")
	setField(r, &m.OBias, c.UseBias, "o_bias", "use_bias")
	setField(r, &m.MLPBias, c.UseBias, "mlp_bias", "use_bias")
	if err := r.slidingWindow(c, m, 0); err != nil {
		return err
	}
	return r.dropoutRates(m, c.Dropout, hfRate{c.ResidualDropout, "residual_dropout"}, hfRate{c.EmbedDropout, "embedding_dropout"})
}

// granite reads Granite's multipliers, 1 when left out (GraniteConfig's
// defaults); one of 0 would divide by zero or zero the model.
func (r *hfRead) granite(c *hfLlama, m *Model) error {
	for _, g := range []struct {
		dst, src *float64
		key      string
	}{
		{&m.EmbeddingMultiplier, c.EmbeddingMultiplier, "embedding_multiplier"},
		{&m.ResidualMultiplier, c.ResidualMultiplier, "residual_multiplier"},
		{&m.AttentionMultiplier, c.AttentionMultiplier, "attention_multiplier"},
		{&m.LogitsScaling, c.LogitsScaling, "logits_scaling"},
	} {
		if g.src != nil && *g.src == 0 {
			return r.d.errField(g.key, "%s: must be positive and finite, got 0", g.key)
		}
		setField(r, g.dst, g.src, g.key, g.key)
	}
	return nil
}

// slidingWindow reads sliding_window: def when the key is left out, none
// when null.
func (r *hfRead) slidingWindow(c *hfLlama, m *Model, def int64) error {
	m.SlidingWindow = def
	if _, given := r.d.pos["sliding_window"]; given && c.SlidingWindow == nil {
		m.SlidingWindow = 0
	}
	if c.SlidingWindow != nil && *c.SlidingWindow <= 0 {
		return r.d.errField("sliding_window", "sliding_window: must be positive, got %d (null for none)", *c.SlidingWindow)
	}
	setField(r, &m.SlidingWindow, c.SlidingWindow, "sliding_window", "sliding_window")
	return nil
}

// gemma2 reads Gemma 2's soft-capping, query scale and sliding window: a
// key left out takes Gemma2Config's default, null turns it off (the
// query scale falls back on head_dim).
func (r *hfRead) gemma2(c *hfLlama, m *Model) error {
	for _, f := range []struct {
		dst, src *float64
		key      string
	}{
		{&m.AttnSoftcap, c.AttnSoftcap, "attn_logit_softcapping"},
		{&m.FinalSoftcap, c.FinalSoftcap, "final_logit_softcapping"},
		{&m.QueryScalar, c.QueryScalar, "query_pre_attn_scalar"},
	} {
		if _, given := r.d.pos[f.key]; given && f.src == nil {
			*f.dst = 0 // null
		}
		if f.src != nil && !(*f.src > 0) {
			return r.d.errField(f.key, "%s: must be positive, got %v (null for none)", f.key, *f.src)
		}
		setField(r, f.dst, f.src, f.key, f.key)
	}
	return r.slidingWindow(c, m, m.SlidingWindow)
}

// hfRate is a dropout rate a config gives under its key.
type hfRate struct {
	v   *float64
	key string
}

// dropoutRates takes the setup's one dropout rate from a family's
// others, besides the attention's (read already), refusing one that
// differs from those before it.
func (r *hfRead) dropoutRates(m *Model, attention *float64, rates ...hfRate) error {
	prev := hfRate{attention, "attention_dropout"}
	for _, p := range rates {
		if p.v == nil {
			continue
		}
		if prev.v != nil && *prev.v != *p.v {
			return r.d.errField(p.key, "%s: %v where %s is %v: ckptplan plans one dropout rate for a model", p.key, *p.v, prev.key, *prev.v)
		}
		setField(r, &m.Training.Dropout, p.v, "training.dropout", p.key)
		prev = p
	}
	return nil
}

func (r *hfRead) gpt2(m *Model) error {
	var c hfGPT2
	if err := r.d.decode(r.root, reflect.ValueOf(&c).Elem(), ""); err != nil {
		return err
	}
	if err := r.required("n_layer", "n_embd", "n_head", "vocab_size"); err != nil {
		return err
	}
	setField(r, &m.Layers, c.Layers, "layers", "n_layer")
	setField(r, &m.Hidden, c.Hidden, "hidden", "n_embd")
	setField(r, &m.Heads, c.Heads, "heads", "n_head")
	setField(r, &m.FFN, c.Inner, "ffn", "n_inner") // null: 4·n_embd, by fillDefaults
	setField(r, &m.Vocab, c.Vocab, "vocab", "vocab_size")
	setField(r, &m.NormEps, c.Eps, "norm_eps", "layer_norm_epsilon")
	m.TiedEmbeddings, m.QKVBias = true, true
	setField(r, &m.TiedEmbeddings, c.Tied, "tied_embeddings", "tie_word_embeddings")
	// GPT-2 has three dropout rates, equal in every published config; the
	// setup has one, and attention's is the one whose mask every layer
	// keeps for its backward.
	m.Training.Dropout = 0.1 // GPT2Config's default
	for _, p := range []struct {
		v   *float64
		key string
	}{{c.AttnPdrop, "attn_pdrop"}, {c.ResidPdrop, "resid_pdrop"}, {c.EmbdPdrop, "embd_pdrop"}} {
		if p.v != nil {
			setField(r, &m.Training.Dropout, p.v, "training.dropout", p.key)
			break
		}
	}
	r.maxPos(m, c.Positions, "n_positions")
	return nil
}
