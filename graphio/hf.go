package graphio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// A Hugging Face config.json is read in three steps. encoding/json checks
// the syntax, so that a truncated or malformed file gets the messages
// people know ("unexpected end of JSON input"), placed at a line:col
// computed from the error's byte offset. The top level is then rebuilt as
// yaml.Nodes whose lines and columns come from the json.Decoder's offsets,
// and the strict YAML decoder, run leniently (configs carry dozens of keys
// that do not change the graph), decodes it and points at the offending
// value. Last, the model's validation errors are mapped back from Model
// fields to the config keys they came from.
//
// yaml.v3 could parse the JSON directly, JSON being YAML, but it rejects
// some valid JSON ("\/", surrogate pairs) and words its errors for YAML.

// hfModelTypes maps the supported values of model_type to the family
// each builds.
var hfModelTypes = map[string]string{
	"gemma":      "gemma",
	"gemma2":     "gemma2",
	"gpt2":       "gpt2",
	"granite":    "granite",
	"llama":      "llama",
	"mistral":    "llama",
	"mixtral":    "llama",
	"phi3":       "phi3",
	"qwen2":      "llama",
	"qwen2_moe":  "llama",
	"qwen3":      "qwen3",
	"qwen3_moe":  "qwen3",
	"starcoder2": "starcoder2",
}

// HFModelTypes returns the values of a config.json's model_type that
// ckptplan builds, sorted.
func HFModelTypes() []string { return slices.Sorted(maps.Keys(hfModelTypes)) }

// HFModelTypesFor returns those ckptplan builds as transformers release r
// runs them, sorted: from 5.0 a mixture of experts runs through
// transformers' experts kernels, which the builders do not model (a trace
// of the model follows them).
func HFModelTypesFor(r Release) []string {
	var out []string
	for _, t := range HFModelTypes() {
		if _, moe := hfMoETypes[t]; moe && rulesOf(r).expertsKernels {
			continue
		}
		out = append(out, t)
	}
	return out
}

// hfMaxTrainSeq caps the default training length taken from
// max_position_embeddings: long-context models (Qwen2's 131072) are
// rarely trained at full length, and s² attention tensors would dwarf
// everything else.
const hfMaxTrainSeq = 8192

// hfCommon holds the keys every supported config reads the same way.
type hfCommon struct {
	ModelType  *string `yaml:"model_type"`
	NameOrPath *string `yaml:"_name_or_path"`
	TorchDType *string `yaml:"torch_dtype"`
	DType      *string `yaml:"dtype"` // the name transformers ≥ 4.56 writes
}

// hfLlama holds the keys of LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config, GemmaConfig, Gemma2Config, Phi3Config, Starcoder2Config
// and GraniteConfig.
type hfLlama struct {
	Layers        *int64   `yaml:"num_hidden_layers"`
	Hidden        *int64   `yaml:"hidden_size"`
	Heads         *int64   `yaml:"num_attention_heads"`
	KVHeads       *int64   `yaml:"num_key_value_heads"`
	FFN           *int64   `yaml:"intermediate_size"`
	Vocab         *int64   `yaml:"vocab_size"`
	Tied          *bool    `yaml:"tie_word_embeddings"`
	NormEps       *float64 `yaml:"rms_norm_eps"`
	RopeTheta     *float64 `yaml:"rope_theta"`
	MaxPos        *int64   `yaml:"max_position_embeddings"`
	AttentionBias *bool    `yaml:"attention_bias"`
	MLPBias       *bool    `yaml:"mlp_bias"`
	// Mixture-of-experts keys, which a dense builder must not ignore.
	LocalExperts  *int64   `yaml:"num_local_experts"` // Mixtral's
	Experts       *int64   `yaml:"num_experts"`       // Qwen2-MoE's and Qwen 3 MoE's
	RoutedExperts *int64   `yaml:"n_routed_experts"`
	ExpertsPerTok *int64   `yaml:"num_experts_per_tok"`
	ExpertFFN     *int64   `yaml:"moe_intermediate_size"`
	SharedFFN     *int64   `yaml:"shared_expert_intermediate_size"`
	NormTopK      *bool    `yaml:"norm_topk_prob"`
	SparseStep    *int64   `yaml:"decoder_sparse_step"`
	MLPOnly       []int64  `yaml:"mlp_only_layers"`
	RouterJitter  *float64 `yaml:"router_jitter_noise"`
	RouterLogits  *bool    `yaml:"output_router_logits"`
	HeadDim       *int64   `yaml:"head_dim"`
	Dropout       *float64 `yaml:"attention_dropout"`
	Act           *string  `yaml:"hidden_act"`
	Activation    *string  `yaml:"hidden_activation"` // Gemma's, where hidden_act is ignored
	ResidDropout  *float64 `yaml:"resid_pdrop"`       // Phi-3
	PartialRotary *float64 `yaml:"partial_rotary_factor"`
	// StarCoder2's names.
	NormEpsilon     *float64 `yaml:"norm_epsilon"`
	UseBias         *bool    `yaml:"use_bias"`
	ResidualDropout *float64 `yaml:"residual_dropout"`
	EmbedDropout    *float64 `yaml:"embedding_dropout"`
	// Granite's multipliers.
	EmbeddingMultiplier *float64 `yaml:"embedding_multiplier"`
	ResidualMultiplier  *float64 `yaml:"residual_multiplier"`
	AttentionMultiplier *float64 `yaml:"attention_multiplier"`
	LogitsScaling       *float64 `yaml:"logits_scaling"`
	// Gemma 2's; null turns soft-capping off, or the window.
	AttnSoftcap   *float64 `yaml:"attn_logit_softcapping"`
	FinalSoftcap  *float64 `yaml:"final_logit_softcapping"`
	QueryScalar   *float64 `yaml:"query_pre_attn_scalar"`
	SlidingWindow *int64   `yaml:"sliding_window"`
	// Qwen2's and Qwen 3's switch for sliding-window layers.
	UseSlidingWindow *bool  `yaml:"use_sliding_window"`
	MaxWindowLayers  *int64 `yaml:"max_window_layers"`
}

// hfGPT2 holds the keys of GPT2Config.
type hfGPT2 struct {
	Layers     *int64   `yaml:"n_layer"`
	Hidden     *int64   `yaml:"n_embd"`
	Heads      *int64   `yaml:"n_head"`
	Inner      *int64   `yaml:"n_inner"`
	Vocab      *int64   `yaml:"vocab_size"`
	Positions  *int64   `yaml:"n_positions"`
	Eps        *float64 `yaml:"layer_norm_epsilon"`
	Tied       *bool    `yaml:"tie_word_embeddings"`
	AttnPdrop  *float64 `yaml:"attn_pdrop"`
	ResidPdrop *float64 `yaml:"resid_pdrop"`
	EmbdPdrop  *float64 `yaml:"embd_pdrop"`
}

// hfRead is one config being read: the decoder, which knows where each
// key is, and the config key each Model field (as Validate names it)
// came from.
type hfRead struct {
	d    *decoder
	root *yaml.Node
	keys map[string]string
}

// ParseHFConfig reads a Hugging Face config.json of a supported
// model_type (gemma, gemma2, gpt2, granite, llama, mistral, phi3, qwen2,
// qwen3, starcoder2) into a Model; file names it in errors, and its base
// name without extension is the model's name when the config has no
// _name_or_path. Keys that do not change the graph are ignored. The
// training setup is ir.DefaultSetup's with what transformers does by
// default (the transformers profile, sdpa attention as 4.48 and later
// run it, fp32 logits in the loss), bf16 training whatever dtype the
// checkpoint was saved in (torch_dtype), the config's dropout, and a sequence length
// of max_position_embeddings (n_positions) capped at 8192.
//
// Errors are *PosError values at the offending value: JSON syntax, wrong
// types, missing or unsupported keys, and whatever Model.Validate
// rejects, named by the config's key. It runs in time linear in
// len(data).
func ParseHFConfig(file string, data []byte) (*Model, error) {
	root, err := parseJSON(file, data)
	if err != nil {
		return nil, err
	}
	r := &hfRead{d: newDecoder(file), root: root, keys: map[string]string{}}
	r.d.lenient = true
	if root.Kind != yaml.MappingNode {
		return nil, r.d.errAt(root, "want a JSON object (a config.json), got %s", jsonKind(root))
	}
	var c hfCommon
	if err := r.d.decode(root, reflect.ValueOf(&c).Elem(), ""); err != nil {
		return nil, err
	}
	supported := strings.Join(HFModelTypes(), ", ")
	if c.ModelType == nil {
		return nil, r.d.errAt(root, "missing model_type (supported: %s)", supported)
	}
	family, ok := hfModelTypes[*c.ModelType]
	if !ok {
		return nil, r.d.errField("model_type", "no builder for model_type %q (ckptplan builds %s); trace it with the Python package, which builds the model on no memory and writes a graph to plan: 'pip install ckptplan' then 'ckptplan trace %s -o model.yaml' and 'ckptplan plan model.yaml' (docs/formats.md)", *c.ModelType, supported, file)
	}
	m := &Model{Name: hfName(file, c.NameOrPath), Family: family, Training: ir.DefaultSetup()}
	// What transformers does by default on PyTorch 2: sdpa attention and
	// a loss that upcasts the logits; GPT-2's softmax stays in the model
	// dtype.
	m.Training.Profile, m.Training.Attention = "transformers", "sdpa"
	m.Training.Numerics.LogitsFP32 = true
	m.Training.Numerics.ByteMasks = true // the GPU a config trains on
	// The newest transformers release verified; --transformers plans
	// for another.
	ApplyRelease(&m.Training, Newest)
	m.Training.Numerics.SoftmaxFP32 = family != "gpt2"
	r.keys["name"] = "_name_or_path"
	if err := r.dtype(&c, m); err != nil {
		return nil, err
	}
	if family == "gpt2" {
		err = r.gpt2(m)
	} else {
		err = r.llama(m, *c.ModelType)
	}
	if err != nil {
		return nil, err
	}
	m.fillDefaults()
	if m.Experts > 0 && rulesOf(Newest).expertsKernels {
		// The newest release whose experts ckptplan models.
		ApplyRelease(&m.Training, NewestExperts)
	}
	if m.AttnSoftcap > 0 && rulesOf(Newest).softcapEager {
		// What transformers picks where sdpa cannot soft-cap.
		m.Training.Attention = "eager"
	}
	if err := m.Validate(); err != nil {
		return nil, r.fieldError(err)
	}
	return m, nil
}

// hfName is _name_or_path if set, else the file's stem ("config" for a
// config.json).
func hfName(file string, nameOrPath *string) string {
	if nameOrPath != nil && *nameOrPath != "" {
		return *nameOrPath
	}
	return fileStem(file)
}

// fileStem is a path's last element without its extension.
func fileStem(file string) string {
	base := file
	if i := strings.LastIndexAny(base, `/\`); i >= 0 {
		base = base[i+1:]
	}
	return strings.TrimSuffix(base, filepath.Ext(base))
}

// dtype checks the dtype the checkpoint was saved in. It is not the
// dtype the model trains in: that is bf16 (with an fp32 master copy)
// unless --dtype says otherwise, whatever the checkpoint's; a dtype
// ckptplan cannot train in (a quantized checkpoint) is an error.
func (r *hfRead) dtype(c *hfCommon, m *Model) error {
	key, v := "torch_dtype", c.TorchDType
	if v == nil {
		key, v = "dtype", c.DType
	}
	if v == nil {
		return nil
	}
	dt, err := ir.ParseDType(*v)
	if err != nil || !slices.Contains(ir.TrainDTypes, dt) {
		return r.d.errField(key, "%s: unsupported dtype %q (supported: float32, bfloat16, float16)", key, *v)
	}
	return nil
}

// required reports the first of the named keys the config lacks: the
// transformers defaults for these describe no particular model, so
// taking them would hide a mistake.
func (r *hfRead) required(keys ...string) error {
	for _, k := range keys {
		if _, ok := r.d.pos[k]; !ok {
			return r.d.errAt(r.root, "missing %s", k)
		}
	}
	return nil
}

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

// setField copies a config value that is present into a Model field and
// remembers which key the field came from.
func setField[T any](r *hfRead, dst, src *T, field, key string) {
	if src != nil {
		*dst = *src
	}
	r.keys[field] = key
}

// maxPos sets the model's sequence limit and the default training length
// from the size of the position table, if the config gives it.
func (r *hfRead) maxPos(m *Model, v *int64, key string) {
	r.keys["max_seq"] = key
	if v == nil {
		return
	}
	m.MaxSeq = *v
	m.Training.Seq = min(*v, hfMaxTrainSeq)
	r.keys["training.seq"] = key
}

// fieldError places a validation error at the config key its field came
// from, named as the config names it.
func (r *hfRead) fieldError(err error) error {
	var fe *ir.FieldError
	if !errors.As(err, &fe) {
		return r.d.errAt(r.root, "%v", err)
	}
	if key, ok := r.keys[fe.Field]; ok {
		return r.d.errField(key, "%s: %s", key, fe.Msg)
	}
	return r.d.errAt(r.root, "%s", fe.Error())
}

// parseJSON checks that data is JSON and returns its top-level value as a
// yaml.Node placed where it starts. Nested objects and arrays come back
// as nodes of their kind without content: no supported key holds one,
// and the decoder needs only their kind to reject them.
func parseJSON(file string, data []byte) (*yaml.Node, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &PosError{File: file, Msg: "empty file"}
	}
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, jsonSyntaxError(file, data, err)
	}
	t := &jsonTokens{dec: json.NewDecoder(bytes.NewReader(data)), pos: textPos{data: data, line: 1, col: 1}}
	t.dec.UseNumber()
	root, delim, err := t.next()
	if err != nil || delim != '{' {
		return root, err
	}
	for t.dec.More() {
		k, _, err := t.next()
		if err != nil {
			return nil, err
		}
		v, delim, err := t.next()
		if err != nil {
			return nil, err
		}
		switch delim {
		case '[':
			// A list of numbers (Qwen's mlp_only_layers) is read;
			// nested containers stay empty.
			if err := t.list(v); err != nil {
				return nil, err
			}
		case '{':
			if err := t.skip(); err != nil {
				return nil, err
			}
		}
		root.Content = append(root.Content, k, v)
	}
	return root, nil
}

// jsonSyntaxError places an encoding/json error at the offending byte, or
// just past the last token when the input ends early.
func jsonSyntaxError(file string, data []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return &PosError{File: file, Msg: err.Error()}
	}
	off := int(se.Offset) - 1
	if off >= len(data) || strings.Contains(se.Error(), "end of JSON input") {
		off = len(bytes.TrimRight(data, " \t\r\n"))
	}
	p := textPos{data: data, line: 1, col: 1}
	line, col := p.at(max(off, 0))
	return &PosError{File: file, Line: line, Col: col, Msg: se.Error()}
}

// jsonTokens reads JSON tokens as yaml.Nodes placed where they start.
type jsonTokens struct {
	dec *json.Decoder
	pos textPos
}

// next reads a token: a scalar node, or for '{' and '[' an empty node of
// the container's kind and the delimiter.
func (t *jsonTokens) next() (*yaml.Node, json.Delim, error) {
	// InputOffset is the end of the last token; the separators between
	// it and the next one are not tokens.
	start := int(t.dec.InputOffset())
	for start < len(t.pos.data) && strings.IndexByte(" \t\r\n:,", t.pos.data[start]) >= 0 {
		start++
	}
	tok, err := t.dec.Token()
	if err != nil {
		return nil, 0, err
	}
	n := &yaml.Node{Kind: yaml.ScalarNode}
	n.Line, n.Column = t.pos.at(start)
	var delim json.Delim
	switch v := tok.(type) {
	case json.Delim:
		delim = v
		n.Kind = yaml.MappingNode
		if v == '[' {
			n.Kind = yaml.SequenceNode
		}
	case string:
		n.Tag, n.Value = "!!str", v
	case json.Number:
		n.Tag, n.Value = "!!int", v.String()
		if strings.ContainsAny(n.Value, ".eE") {
			n.Tag = "!!float"
		}
	case bool:
		n.Tag, n.Value = "!!bool", fmt.Sprint(v)
	case nil:
		n.Tag, n.Value = "!!null", "null"
	}
	return n, delim, nil
}

// list reads the rest of a list whose '[' was read into seq, each
// element a node; an element that is itself a container is left empty.
func (t *jsonTokens) list(seq *yaml.Node) error {
	for t.dec.More() {
		v, delim, err := t.next()
		if err != nil {
			return err
		}
		if delim != 0 {
			if err := t.skip(); err != nil {
				return err
			}
		}
		seq.Content = append(seq.Content, v)
	}
	_, err := t.dec.Token() // ']'
	return err
}

// skip reads the rest of a container whose opening delimiter was read.
func (t *jsonTokens) skip() error {
	for depth := 1; depth > 0; {
		tok, err := t.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

func jsonKind(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.SequenceNode:
		return "an array"
	case n.Tag == "!!null":
		return "null"
	case n.Tag == "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	}
	return "the value " + n.Value
}

// textPos turns byte offsets into 1-based lines and columns counted in
// runes, as yaml.v3 counts them. Offsets that grow from call to call scan
// the data once in all.
type textPos struct {
	data      []byte
	off       int
	line, col int
}

func (p *textPos) at(off int) (line, col int) {
	if off < p.off {
		p.off, p.line, p.col = 0, 1, 1
	}
	off = min(off, len(p.data))
	for p.off < off {
		r, size := utf8.DecodeRune(p.data[p.off:])
		p.off += size
		if r == '\n' {
			p.line, p.col = p.line+1, 1
		} else {
			p.col++
		}
	}
	return p.line, p.col
}
