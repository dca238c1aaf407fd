package graphio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
)

// hfConfig holds the fields of a Hugging Face config.json that shape the
// graph. Pointers tell an absent field from a zero one.
type hfConfig struct {
	ModelType  string  `yaml:"model_type"`
	NameOrPath string  `yaml:"_name_or_path"`
	TorchDType *string `yaml:"torch_dtype"`

	// Llama, Mistral, Qwen2.
	Layers      *int64   `yaml:"num_hidden_layers"`
	Hidden      *int64   `yaml:"hidden_size"`
	Heads       *int64   `yaml:"num_attention_heads"`
	KVHeads     *int64   `yaml:"num_key_value_heads"`
	FFN         *int64   `yaml:"intermediate_size"`
	Vocab       *int64   `yaml:"vocab_size"`
	Tie         *bool    `yaml:"tie_word_embeddings"`
	RMSEps      *float64 `yaml:"rms_norm_eps"`
	RopeTheta   *float64 `yaml:"rope_theta"`
	MaxPos      *int64   `yaml:"max_position_embeddings"`
	AttnBias    *bool    `yaml:"attention_bias"`
	AttnDropout *float64 `yaml:"attention_dropout"`
	HeadDim     *int64   `yaml:"head_dim"`

	// GPT-2.
	NLayer   *int64   `yaml:"n_layer"`
	NEmbd    *int64   `yaml:"n_embd"`
	NHead    *int64   `yaml:"n_head"`
	NInner   *int64   `yaml:"n_inner"`
	NPos     *int64   `yaml:"n_positions"`
	LNEps    *float64 `yaml:"layer_norm_epsilon"`
	AttnDrop *float64 `yaml:"attn_pdrop"`
}

// hfTypes maps the supported model_type values to our families.
var hfTypes = map[string]string{"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2"}

// hfFields maps model fields to the config keys they come from, so that a
// validation error points at the key.
var hfFields = map[string]string{
	"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
	"kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
	"norm_eps": "rms_norm_eps", "max_seq": "max_position_embeddings", "training.dropout": "attention_dropout",
	"training.dtype": "torch_dtype",
}

var gpt2Fields = map[string]string{
	"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "n_head", "ffn": "n_inner",
	"vocab": "vocab_size", "norm_eps": "layer_norm_epsilon", "max_seq": "n_positions",
	"training.dropout": "attn_pdrop", "training.dtype": "torch_dtype",
}

// ParseHFConfig reads a Hugging Face config.json of a llama, mistral, qwen2
// or gpt2 model. Keys it does not need are ignored. The training setup is
// ir.DefaultSetup with the config's dtype and dropout, and a sequence of
// the model's context length up to 8192.
func ParseHFConfig(file string, data []byte) (*Model, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &PosError{File: file, Msg: "empty file"}
	}
	if err := checkJSON(file, data); err != nil {
		return nil, err
	}
	root, err := parseYAML(file, data)
	if err != nil {
		return nil, err
	}
	d := newDecoder(file)
	d.lenient = true
	var c hfConfig
	if err := d.decode(root, reflect.ValueOf(&c).Elem(), ""); err != nil {
		return nil, err
	}
	family, ok := hfTypes[c.ModelType]
	if !ok {
		var types []string
		for t := range hfTypes {
			types = append(types, t)
		}
		sort.Strings(types)
		at := d.pos["model_type"]
		if at == nil {
			at = root
		}
		return nil, d.errAt(at, "unsupported model_type %q (supported: %s)", c.ModelType, strings.Join(types, ", "))
	}
	m, err := c.model(family, file)
	if err != nil {
		return nil, d.errAt(root, "%v", err)
	}
	m.fillDefaults()
	if err := m.Validate(); err != nil {
		var fe *ir.FieldError
		if errors.As(err, &fe) {
			fields := hfFields
			if family == "gpt2" {
				fields = gpt2Fields
			}
			key := fields[fe.Field]
			msg := fe.Msg
			if key != "" {
				msg = key + ": " + msg
			}
			return nil, d.errField(key, "%s", msg)
		}
		return nil, d.errAt(root, "%v", err)
	}
	return m, nil
}

func (c *hfConfig) model(family, file string) (*Model, error) {
	i := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	m := &Model{Family: family, Training: ir.DefaultSetup()}
	m.Name = c.NameOrPath
	if m.Name == "" {
		m.Name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	if family == "gpt2" {
		m.Layers, m.Hidden, m.Heads, m.FFN, m.Vocab, m.MaxSeq = i(c.NLayer), i(c.NEmbd), i(c.NHead), i(c.NInner), i(c.Vocab), i(c.NPos)
		m.KVHeads = m.Heads
		m.TiedEmbeddings, m.QKVBias = c.Tie == nil || *c.Tie, true
		if c.LNEps != nil {
			m.NormEps = *c.LNEps
		}
		if c.AttnDrop != nil {
			m.Training.Dropout = *c.AttnDrop
		}
	} else {
		m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFN, m.Vocab, m.MaxSeq = i(c.Layers), i(c.Hidden), i(c.Heads), i(c.KVHeads), i(c.FFN), i(c.Vocab), i(c.MaxPos)
		m.TiedEmbeddings = c.Tie != nil && *c.Tie
		m.QKVBias = c.ModelType == "qwen2" || c.AttnBias != nil && *c.AttnBias
		if c.RMSEps != nil {
			m.NormEps = *c.RMSEps
		}
		if c.RopeTheta != nil {
			m.RopeTheta = *c.RopeTheta
		}
		if c.AttnDropout != nil {
			m.Training.Dropout = *c.AttnDropout
		}
		if c.HeadDim != nil && m.Heads > 0 && *c.HeadDim != m.Hidden/m.Heads {
			return nil, fmt.Errorf("head_dim %d differs from hidden_size/num_attention_heads = %d: not supported", *c.HeadDim, m.Hidden/m.Heads)
		}
	}
	if c.TorchDType != nil {
		dt, err := ir.ParseDType(*c.TorchDType)
		if err != nil {
			return nil, fmt.Errorf("torch_dtype: %v", err)
		}
		m.Training.DType = dt.String()
	}
	if m.MaxSeq > 0 {
		m.Training.Seq = min(m.MaxSeq, 8192)
	}
	return m, nil
}

// checkJSON reports a JSON syntax error at its line and column.
func checkJSON(file string, data []byte) error {
	var v any
	err := json.Unmarshal(data, &v)
	if err == nil {
		if _, ok := v.(map[string]any); !ok {
			return &PosError{File: file, Line: 1, Col: 1, Msg: "want a JSON object (a config.json), got " + jsonKind(v)}
		}
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	offset := int64(len(data))
	switch {
	case errors.As(err, &se):
		offset = se.Offset
	case errors.As(err, &te):
		offset = te.Offset
	}
	line, col := lineCol(data, offset)
	return &PosError{File: file, Line: line, Col: col, Msg: "invalid JSON: " + err.Error()}
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case nil:
		return "null"
	}
	return "a " + fmt.Sprintf("%T", v)
}

// lineCol converts a byte offset to a 1-based line and column.
func lineCol(data []byte, offset int64) (int, int) {
	offset = min(max(offset, 0), int64(len(data)))
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n')
	return line, col
}
