package graphio

import (
	"errors"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

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
		return nil, needsTrace(r.d.errField("model_type", "no builder for model_type %q (ckptplan builds %s); trace it with the Python package, which builds the model on no memory and writes a graph to plan: 'pip install ./python' from a clone of ckptplan (or its wheel) then 'ckptplan trace %s -o model.yaml' and 'ckptplan plan model.yaml' (docs/formats.md)", *c.ModelType, supported, file))
	}
	m := &Model{Name: hfName(file, c.NameOrPath), Family: family, Training: ir.DefaultSetup()}
	// What transformers does by default on PyTorch 2: sdpa attention and
	// a loss that upcasts the logits; GPT-2's softmax stays in the model
	// dtype.
	m.Training.Profile, m.Training.Attention = ir.ProfileTransformers, ir.AttentionSDPA
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
		m.Training.Attention = ir.AttentionEager
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
		return withKind(r.d.errField(key, "%s: %s", key, fe.Msg), kindOf(err))
	}
	return withKind(r.d.errAt(r.root, "%s", fe.Error()), kindOf(err))
}
