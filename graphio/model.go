package graphio

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// maxLayers bounds a model's layers: each is a stage of the solver's
// chain (the embedding and the head are two more).
const maxLayers = ir.MaxStages - 2

// Model describes a transformer of a known family and how it is trained.
// Zero architecture fields take the family's defaults (kv_heads = heads;
// ffn = 4·hidden for gpt2); Training fields left out take
// ir.DefaultSetup's.
type Model struct {
	Name    string `yaml:"name" json:"name"`
	Family  string `yaml:"family" json:"family"` // one of Families
	Layers  int64  `yaml:"layers" json:"layers"`
	Hidden  int64  `yaml:"hidden" json:"hidden"`
	Heads   int64  `yaml:"heads" json:"heads"`
	KVHeads int64  `yaml:"kv_heads" json:"kv_heads"`
	// HeadSize is the size of one attention head, when it is not
	// hidden/heads (Mistral-NeMo, Gemma): 0 for hidden/heads.
	HeadSize       int64   `yaml:"head_dim,omitempty" json:"head_dim,omitempty"`
	FFN            int64   `yaml:"ffn" json:"ffn"`
	Vocab          int64   `yaml:"vocab" json:"vocab"`
	TiedEmbeddings bool    `yaml:"tied_embeddings" json:"tied_embeddings"`
	QKVBias        bool    `yaml:"qkv_bias" json:"qkv_bias"`
	OBias          bool    `yaml:"o_bias,omitempty" json:"o_bias,omitempty"`     // llama: the attention's output projection has a bias
	MLPBias        bool    `yaml:"mlp_bias,omitempty" json:"mlp_bias,omitempty"` // llama: gate, up and down have biases
	NormEps        float64 `yaml:"norm_eps" json:"norm_eps"`
	RopeTheta      float64 `yaml:"rope_theta" json:"rope_theta"`
	MaxSeq         int64   `yaml:"max_seq" json:"max_seq"`
	// Granite's multipliers, 1 when left out: of the embeddings, of each
	// residual branch before its add, of the attention scores (in place
	// of 1/√head_dim); the logits are divided by LogitsScaling.
	EmbeddingMultiplier float64 `yaml:"embedding_multiplier,omitempty" json:"embedding_multiplier,omitempty"`
	ResidualMultiplier  float64 `yaml:"residual_multiplier,omitempty" json:"residual_multiplier,omitempty"`
	AttentionMultiplier float64 `yaml:"attention_multiplier,omitempty" json:"attention_multiplier,omitempty"`
	LogitsScaling       float64 `yaml:"logits_scaling,omitempty" json:"logits_scaling,omitempty"`
	// Gemma 2's soft-capping, 0 for none: eager attention divides the
	// scores by AttnSoftcap, takes tanh and multiplies back, and the
	// logits are capped by FinalSoftcap alike. Its queries are scaled by
	// 1/√QueryScalar (0: by 1/√head_dim).
	AttnSoftcap  float64 `yaml:"attn_logit_softcapping,omitempty" json:"attn_logit_softcapping,omitempty"`
	FinalSoftcap float64 `yaml:"final_logit_softcapping,omitempty" json:"final_logit_softcapping,omitempty"`
	QueryScalar  float64 `yaml:"query_pre_attn_scalar,omitempty" json:"query_pre_attn_scalar,omitempty"`
	// SlidingWindow: the sliding layers attend within that many tokens
	// (0: none): Gemma 2's every other layer from the first; the others'
	// (Mistral, StarCoder2, Phi-3: family llama, starcoder2, phi3) every
	// layer from SlidingFrom on (Qwen2's max_window_layers). The window
	// changes only the mask, which transformers makes for a sliding layer
	// from 4.53 when the sequence reaches the window, and which sdpa then
	// keeps, with K and V repeated.
	SlidingWindow int64 `yaml:"sliding_window,omitempty" json:"sliding_window,omitempty"`
	SlidingFrom   int64 `yaml:"sliding_from,omitempty" json:"sliding_from,omitempty"`
	// A mixture of experts in place of the MLP (Mixtral, Qwen2-MoE, Qwen
	// 3 MoE): a router picks ExpertsPerToken of Experts experts for each
	// token, each a gated MLP of ExpertFFN (0: ffn), and NormTopK divides
	// the chosen weights by their sum. Qwen2-MoE adds a shared expert of
	// SharedExpertFFN that every token goes through, gated by a sigmoid.
	// DenseLayers keep a dense MLP of ffn.
	Experts         int64    `yaml:"experts,omitempty" json:"experts,omitempty"`
	ExpertsPerToken int64    `yaml:"experts_per_token,omitempty" json:"experts_per_token,omitempty"`
	ExpertFFN       int64    `yaml:"expert_ffn,omitempty" json:"expert_ffn,omitempty"`
	SharedExpertFFN int64    `yaml:"shared_expert_ffn,omitempty" json:"shared_expert_ffn,omitempty"`
	NormTopK        bool     `yaml:"norm_topk,omitempty" json:"norm_topk,omitempty"`
	DenseLayers     []int64  `yaml:"dense_layers,omitempty" json:"dense_layers,omitempty"`
	Training        ir.Setup `yaml:"training" json:"training"`
}

// Routed reports whether layer l routes its tokens to experts.
func (m *Model) Routed(l int64) bool {
	return m.Experts > 0 && !slices.Contains(m.DenseLayers, l)
}

// moeFamilies are the families whose MLP may be a mixture of experts.
var moeFamilies = []string{"llama", "qwen3"}

// Families lists the model families the builders know: GPT-2; Llama
// (Mistral, Qwen2); Gemma, Llama's layer with GELU, a (1 + w) RMS norm in
// fp32 and embeddings scaled by √hidden; Phi-3, Llama's layer with fused
// q/k/v and gate/up projections and dropout on the residual branches;
// StarCoder2, Llama's attention with GPT-2's LayerNorms and MLP and
// dropout on the embeddings and residual branches; Granite, Llama's layer
// with constant multipliers on the embeddings, the residual branches, the
// attention scores and the logits; Gemma 2, Gemma's layer with norms after
// the attention and the MLP as well as before, soft-capped scores and
// logits, and sliding-window attention in every other layer; Qwen 3,
// Llama's layer with each query and key head RMS-normalized before the
// rotary embedding.
var Families = []string{"gemma", "gemma2", "gpt2", "granite", "llama", "phi3", "qwen3", "starcoder2"}

// familyField is a model field that only one family has.
type familyField struct {
	name   string // as YAML names it
	family string
	v      *float64
	def    float64 // what 0 (left out) means: Granite's multipliers are 1
}

// familyFields returns the fields only one family has but Gemma 2's
// sliding window, an integer.
func (m *Model) familyFields() []familyField {
	return []familyField{
		{"embedding_multiplier", "granite", &m.EmbeddingMultiplier, 1},
		{"residual_multiplier", "granite", &m.ResidualMultiplier, 1},
		{"attention_multiplier", "granite", &m.AttentionMultiplier, 1},
		{"logits_scaling", "granite", &m.LogitsScaling, 1},
		{"attn_logit_softcapping", "gemma2", &m.AttnSoftcap, 0},
		{"final_logit_softcapping", "gemma2", &m.FinalSoftcap, 0},
		{"query_pre_attn_scalar", "gemma2", &m.QueryScalar, 0},
	}
}

// Sliding reports whether layer l attends within a sliding window: Gemma
// 2's even layers, the others' from SlidingFrom on, when there is a window.
func (m *Model) Sliding(l int64) bool {
	if m.SlidingWindow <= 0 {
		return false
	}
	if m.Family == "gemma2" {
		return l%2 == 0
	}
	return l >= m.SlidingFrom
}

// HeadDim returns the size of one attention head: HeadSize, or
// hidden/heads.
func (m *Model) HeadDim() int64 {
	if m.HeadSize > 0 {
		return m.HeadSize
	}
	return m.Hidden / m.Heads
}

// ParseModel reads a model YAML document. file names it in errors.
func ParseModel(file string, data []byte) (*Model, error) {
	return parseDocument(file, data, decodeModel)
}

func decodeModel(d *decoder, root *yaml.Node) (*Model, error) {
	m := &Model{Training: ir.DefaultSetup()}
	if err := d.decode(root, reflect.ValueOf(m).Elem(), ""); err != nil {
		return nil, err
	}
	if _, given := d.pos["kv_heads"]; given && m.KVHeads == 0 {
		return nil, d.errField("kv_heads", "kv_heads: must be positive, got 0 (leave it out for as many as heads)")
	}
	for _, f := range m.familyFields() {
		if _, given := d.pos[f.name]; given && *f.v == 0 && f.def != 0 {
			return nil, d.errField(f.name, "%s: must be positive and finite, got 0 (leave it out for %v)", f.name, f.def)
		}
	}
	if v := m.Training.Transformers; v != "" {
		// The release decides the numerics it changed, whatever
		// training.numerics says of them.
		r, err := ParseRelease(v)
		if err != nil {
			return nil, d.errField("training.transformers", "training.transformers: %v", err)
		}
		ApplyRelease(&m.Training, r)
	}
	m.fillDefaults()
	if err := m.Validate(); err != nil {
		if fe := (*ir.FieldError)(nil); errors.As(err, &fe) {
			return nil, withKind(d.errField(fe.Field, "%s", fe.Error()), kindOf(err))
		}
		return nil, d.errAt(root, "%v", err)
	}
	return m, nil
}

func (m *Model) fillDefaults() {
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	if m.FFN == 0 && m.Family == "gpt2" {
		m.FFN = 4 * m.Hidden
	}
	if m.NormEps == 0 {
		m.NormEps = 1e-5
	}
	if m.Experts > 0 && m.ExpertFFN == 0 {
		m.ExpertFFN = m.FFN
	}
	if m.RopeTheta == 0 && m.Family != "gpt2" {
		m.RopeTheta = 10000
	}
	for _, f := range m.familyFields() {
		if f.family == m.Family && *f.v == 0 {
			*f.v = f.def
		}
	}
}

// fe is a model's validation error: a field and what is wrong with it.
func fe(field, format string, args ...any) error {
	return &ir.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks the architecture and the training setup. Errors are
// *ir.FieldError values naming the field.
func (m *Model) Validate() error {
	if m.Name == "" {
		return fe("name", "missing model name")
	}
	if !slices.Contains(Families, m.Family) {
		return fe("family", "unknown family %q (valid: %s)", m.Family, strings.Join(Families, ", "))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"kv_heads", m.KVHeads}, {"ffn", m.FFN}, {"vocab", m.Vocab}} {
		if f.v <= 0 {
			return fe(f.name, "must be positive, got %d", f.v)
		}
	}
	if m.Layers > maxLayers {
		return fe("layers", "%d layers, more than the %d ckptplan plans", m.Layers, maxLayers)
	}
	if m.MaxSeq < 0 {
		return fe("max_seq", "must not be negative, got %d", m.MaxSeq)
	}
	if m.Family == "gpt2" && m.MaxSeq > 0 && m.Training.Seq > m.MaxSeq {
		return fe("training.seq", "%d tokens, more than the %d positions a GPT-2 model learns (max_seq)", m.Training.Seq, m.MaxSeq)
	}
	if m.NormEps <= 0 {
		return fe("norm_eps", "must be positive, got %v", m.NormEps)
	}
	for _, f := range m.familyFields() {
		switch v := *f.v; {
		case v != 0 && m.Family != f.family:
			return fe(f.name, "is a %s field; a %s model has none", f.family, m.Family)
		case m.Family == f.family && (f.def != 0 || v != 0) && !(v > 0 && !math.IsInf(v, 1)):
			return fe(f.name, "must be positive and finite, got %v", v)
		}
	}
	switch {
	case m.SlidingWindow != 0 && !slices.Contains([]string{"gemma2", "llama", "starcoder2", "phi3"}, m.Family):
		return fe("sliding_window", "is a field of gemma2, llama (Mistral), starcoder2 and phi3; a %s model has none", m.Family)
	case m.SlidingWindow < 0:
		return fe("sliding_window", "must be positive, got %d", m.SlidingWindow)
	case m.SlidingFrom != 0 && (m.SlidingWindow == 0 || m.Family == "gemma2"):
		return fe("sliding_from", "goes with a sliding_window, and not with gemma2 (whose even layers slide)")
	case m.SlidingFrom < 0:
		return fe("sliding_from", "must be a layer index, got %d", m.SlidingFrom)
	}
	if err := m.validateExperts(); err != nil {
		return err
	}
	if m.HeadSize < 0 || m.HeadSize > 0 && m.Family == "gpt2" && m.HeadSize != m.Hidden/m.Heads {
		return fe("head_dim", "must be positive, and hidden/heads for gpt2, got %d", m.HeadSize)
	}
	if m.HeadSize == 0 && m.Hidden%m.Heads != 0 {
		return fe("heads", "%d heads do not divide hidden size %d (give head_dim for a head size of its own)", m.Heads, m.Hidden)
	}
	if m.Heads%m.KVHeads != 0 {
		return fe("kv_heads", "%d kv_heads do not divide %d heads", m.KVHeads, m.Heads)
	}
	if m.Family == "gpt2" && m.KVHeads != m.Heads {
		return fe("kv_heads", "gpt2 has no grouped-query attention: kv_heads must equal heads (%d)", m.Heads)
	}
	if m.Family != "gpt2" && m.HeadDim()%2 != 0 {
		return fe("heads", "head size %d is odd; rotary embeddings need an even one", m.HeadDim())
	}
	if m.Training.Autocast != "" && m.Training.Profile != ir.ProfileTransformers {
		return fe("training.autocast", "autocast is planned under the transformers profile")
	}
	if err := m.Training.Validate("training"); err != nil {
		return err
	}
	t := &m.Training
	if len(t.LoRA.Targets) == 0 {
		t.LoRA.Targets, _ = DefaultLoRATargets(m.Family)
	}
	if t.Parallel.TP > 1 {
		if m.Heads%t.Parallel.TP != 0 {
			return fe("training.parallel.tp", "tensor parallel degree %d does not divide %d heads", t.Parallel.TP, m.Heads)
		}
	}
	if err := m.checkRelease(); err != nil {
		return err
	}
	return m.checkSizes()
}

// validateExperts checks a mixture of experts' fields, and refuses what
// is not modelled with them: LoRA on the experts, torch.autocast, tensor
// parallelism (expert parallelism), Megatron's accounting.
func (m *Model) validateExperts() error {
	if m.Experts == 0 {
		for _, f := range []struct {
			name  string
			given bool
		}{{"experts_per_token", m.ExpertsPerToken != 0}, {"expert_ffn", m.ExpertFFN != 0},
			{"shared_expert_ffn", m.SharedExpertFFN != 0}, {"norm_topk", m.NormTopK}, {"dense_layers", len(m.DenseLayers) > 0}} {
			if f.given {
				return fe(f.name, "is a field of a mixture of experts, and the model has no experts")
			}
		}
		return nil
	}
	t := &m.Training
	switch {
	case m.Experts < 0:
		return fe("experts", "must be positive, got %d", m.Experts)
	case !slices.Contains(moeFamilies, m.Family):
		return fe("experts", "a %s model has no mixture of experts (families with one: %s)", m.Family, strings.Join(moeFamilies, ", "))
	case m.ExpertsPerToken <= 0 || m.ExpertsPerToken > m.Experts:
		return fe("experts_per_token", "must be between 1 and experts (%d), got %d", m.Experts, m.ExpertsPerToken)
	case m.ExpertFFN < 0:
		return fe("expert_ffn", "must be positive, got %d", m.ExpertFFN)
	case m.SharedExpertFFN < 0:
		return fe("shared_expert_ffn", "must not be negative, got %d", m.SharedExpertFFN)
	case t.Autocast != "":
		return fe("training.autocast", "a mixture of experts under torch.autocast is not modelled yet: plan it in its own dtype")
	case t.Parallel.TP > 1:
		return fe("training.parallel.tp", "a mixture of experts over tensor-parallel ranks (expert parallelism) is not modelled yet")
	case t.Profile == ir.ProfileMegatron:
		return fe("training.profile", "a mixture of experts is planned under the transformers or torch-eager profile, not megatron")
	}
	for _, target := range t.LoRA.Targets {
		if slices.Contains([]ir.LoRATarget{ir.LoRAGate, ir.LoRAUp, ir.LoRADown, "gate_up"}, target) {
			return fe("training.lora.targets", "LoRA on the MLP (%s) of a mixture of experts is not modelled yet: adapt the attention (q, k, v, o)", target)
		}
	}
	for i, l := range m.DenseLayers {
		if l < 0 || l >= m.Layers {
			return fe(fmt.Sprintf("dense_layers[%d]", i), "layer %d is not one of the model's %d", l, m.Layers)
		}
	}
	if _, ok := (ir.Shape{m.Layers, m.Experts, m.Hidden, m.ExpertFFN, 3 * 8}).Elements(); !ok {
		return fe("experts", "%d experts of %d×%d overflow int64 bytes", m.Experts, m.Hidden, m.ExpertFFN)
	}
	return nil
}

// checkSizes rejects models whose largest tensors or parameter count
// would overflow int64 bytes.
// tooLarge is a field whose sizes pass what int64 counts: an
// ir.FieldError that is also ir.ErrTooLarge.
type tooLarge struct{ fe *ir.FieldError }

func (e tooLarge) Error() string   { return e.fe.Error() }
func (e tooLarge) Unwrap() []error { return []error{e.fe, ir.ErrTooLarge} }

func (m *Model) checkSizes() error {
	t := &m.Training
	for _, s := range []struct {
		field string
		shape ir.Shape
	}{
		{"training.batch", ir.Shape{t.Batch, m.Heads, 8}},
		{"training.seq", ir.Shape{t.Batch, m.Heads, t.Seq, t.Seq, 8}},
		{"vocab", ir.Shape{t.Batch, t.Seq, m.Vocab, 8}},
		{"ffn", ir.Shape{t.Batch, t.Seq, m.FFN, 8}},
		{"hidden", ir.Shape{m.Layers, m.Hidden, m.Hidden + m.FFN + m.Vocab, 64}},
	} {
		if _, ok := s.shape.Elements(); !ok {
			return tooLarge{&ir.FieldError{Field: s.field, Msg: fmt.Sprintf("sizes are too large: a tensor of %v elements overflows int64 bytes", s.shape[:len(s.shape)-1])}}
		}
	}
	return nil
}
