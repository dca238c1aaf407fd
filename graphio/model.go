package graphio

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/solver"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// maxLayers bounds a model's layers: each is a stage of the solver's
// chain (the embedding and the head are two more).
const maxLayers = solver.MaxStages - 2

// Model describes a transformer of a known family and how it is trained.
// Zero architecture fields take the family's defaults (kv_heads = heads;
// ffn = 4·hidden for gpt2); Training fields left out take
// ir.DefaultSetup's.
type Model struct {
	Name    string `yaml:"name" json:"name"`
	Family  string `yaml:"family" json:"family"` // gemma | gpt2 | granite | llama | phi3 | starcoder2
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
	EmbeddingMultiplier float64  `yaml:"embedding_multiplier,omitempty" json:"embedding_multiplier,omitempty"`
	ResidualMultiplier  float64  `yaml:"residual_multiplier,omitempty" json:"residual_multiplier,omitempty"`
	AttentionMultiplier float64  `yaml:"attention_multiplier,omitempty" json:"attention_multiplier,omitempty"`
	LogitsScaling       float64  `yaml:"logits_scaling,omitempty" json:"logits_scaling,omitempty"`
	Training            ir.Setup `yaml:"training" json:"training"`
}

// Families lists the model families the builders know: GPT-2; Llama
// (Mistral, Qwen2); Gemma, Llama's layer with GELU, a (1 + w) RMS norm in
// fp32 and embeddings scaled by √hidden; Phi-3, Llama's layer with fused
// q/k/v and gate/up projections and dropout on the residual branches;
// StarCoder2, Llama's attention with GPT-2's LayerNorms and MLP and
// dropout on the embeddings and residual branches; Granite, Llama's layer
// with constant multipliers on the embeddings, the residual branches, the
// attention scores and the logits.
var Families = []string{"gemma", "gpt2", "granite", "llama", "phi3", "starcoder2"}

// granites returns Granite's multipliers with their YAML names.
func (m *Model) granites() []struct {
	name string
	v    *float64
} {
	return []struct {
		name string
		v    *float64
	}{
		{"embedding_multiplier", &m.EmbeddingMultiplier}, {"residual_multiplier", &m.ResidualMultiplier},
		{"attention_multiplier", &m.AttentionMultiplier}, {"logits_scaling", &m.LogitsScaling},
	}
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
	root, err := parseYAML(file, data)
	if err != nil {
		return nil, err
	}
	return decodeModel(newDecoder(file), root)
}

func decodeModel(d *decoder, root *yaml.Node) (*Model, error) {
	m := &Model{Training: ir.DefaultSetup()}
	if err := d.decode(root, reflect.ValueOf(m).Elem(), ""); err != nil {
		return nil, err
	}
	if _, given := d.pos["kv_heads"]; given && m.KVHeads == 0 {
		return nil, d.errField("kv_heads", "kv_heads: must be positive, got 0 (leave it out for as many as heads)")
	}
	for _, g := range m.granites() {
		if _, given := d.pos[g.name]; given && *g.v == 0 {
			return nil, d.errField(g.name, "%s: must be positive and finite, got 0 (leave it out for 1)", g.name)
		}
	}
	m.fillDefaults()
	if err := m.Validate(); err != nil {
		if fe, ok := err.(*ir.FieldError); ok {
			return nil, d.errField(fe.Field, "%s", fe.Error())
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
	if m.RopeTheta == 0 && m.Family != "gpt2" {
		m.RopeTheta = 10000
	}
	if m.Family == "granite" {
		for _, g := range m.granites() {
			if *g.v == 0 {
				*g.v = 1
			}
		}
	}
}

// Validate checks the architecture and the training setup. Errors are
// *ir.FieldError values naming the field.
func (m *Model) Validate() error {
	fe := func(field, format string, args ...any) error {
		return &ir.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
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
	for _, g := range m.granites() {
		switch v := *g.v; {
		case v != 0 && m.Family != "granite":
			return fe(g.name, "is a granite multiplier; a %s model has none", m.Family)
		case m.Family == "granite" && !(v > 0 && !math.IsInf(v, 1)):
			return fe(g.name, "must be positive and finite, got %v", v)
		}
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
	if m.Training.Autocast != "" && m.Training.Profile != "transformers" {
		return fe("training.autocast", "autocast is planned under the transformers profile")
	}
	if err := m.Training.Validate("training"); err != nil {
		return err
	}
	t := &m.Training
	if t.Parallel.TP > 1 {
		if m.Heads%t.Parallel.TP != 0 {
			return fe("training.parallel.tp", "tensor parallel degree %d does not divide %d heads", t.Parallel.TP, m.Heads)
		}
	}
	return m.checkSizes()
}

// checkSizes rejects models whose largest tensors or parameter count
// would overflow int64 bytes.
func (m *Model) checkSizes() error {
	t := &m.Training
	for _, s := range []struct {
		field string
		shape ir.Shape
	}{
		{"training.seq", ir.Shape{t.Batch, m.Heads, t.Seq, t.Seq, 8}},
		{"vocab", ir.Shape{t.Batch, t.Seq, m.Vocab, 8}},
		{"ffn", ir.Shape{t.Batch, t.Seq, m.FFN, 8}},
		{"hidden", ir.Shape{m.Layers, m.Hidden, m.Hidden + m.FFN + m.Vocab, 64}},
	} {
		if _, ok := s.shape.Elements(); !ok {
			return &ir.FieldError{Field: s.field, Msg: fmt.Sprintf("sizes are too large: a tensor of %v elements overflows int64 bytes", s.shape[:len(s.shape)-1])}
		}
	}
	return nil
}
