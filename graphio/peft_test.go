package graphio

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

// hfModel parses one of testdata/hf's configs.
func hfModel(t testing.TB, file string) *Model {
	t.Helper()
	path := filepath.Join("testdata", "hf", file)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseHFConfig(path, data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestApplyPEFTAdapter reads adapter configs as PEFT writes them
// (LoraConfig.save_pretrained): target_modules matched as PEFT matches
// them (an entry is a module's name or the end of it after a dot; a
// string is a pattern the whole name matches), its defaults where a key
// is missing (r 8, PEFT's targets for the model type).
func TestApplyPEFTAdapter(t *testing.T) {
	qv := []ir.LoRATarget{"q", "v"}
	tests := []struct {
		name, base, json string
		want             ir.LoRA
	}{
		{"llama q_proj v_proj", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["v_proj", "q_proj"], "bias": "none", "use_dora": false, "rank_pattern": {}, "alpha_pattern": {"q_proj": 4}, "modules_to_save": null, "layers_to_transform": null}`,
			ir.LoRA{Rank: 16, Targets: qv, Dropout: 0.05, Alpha: 32, FP32: true}},
		{"PEFT's defaults", "llama-3.2-1b.json", `{"peft_type": "LORA"}`, ir.LoRA{Rank: 8, Targets: qv, Alpha: 8, FP32: true}},
		{"null targets", "qwen2-1.5b.json", `{"peft_type": "LORA", "r": 4, "target_modules": null}`, ir.LoRA{Rank: 4, Targets: qv, Alpha: 8, FP32: true}},
		{"all-linear", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 4, "target_modules": "all-linear"}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "k", "v", "o", "gate", "up", "down"}, Alpha: 8, FP32: true}},
		{"pattern", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 4, "target_modules": ".*\\.(q|o)_proj"}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "o"}, Alpha: 8, FP32: true}},
		{"pattern over the MLP", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 4, "target_modules": "model\\.layers\\.\\d+\\.mlp\\..*"}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"gate", "up", "down"}, Alpha: 8, FP32: true}},
		{"a name's end", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 4, "target_modules": ["self_attn.o_proj", "mlp.down_proj"]}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"o", "down"}, Alpha: 8, FP32: true}},
		{"excluded", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 4, "target_modules": "all-linear", "exclude_modules": ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "k", "v", "o"}, Alpha: 8, FP32: true}},
		{"gpt2 default: c_attn", "gpt2.json", `{"peft_type": "LORA", "r": 4}`, ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "k", "v"}, Alpha: 8, FP32: true}},
		{"gpt2 c_proj: both", "gpt2.json", `{"peft_type": "LORA", "r": 4, "target_modules": ["c_proj"]}`, ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"o", "down"}, Alpha: 8, FP32: true}},
		{"gpt2 attn.c_proj", "gpt2.json", `{"peft_type": "LORA", "r": 4, "target_modules": ["attn.c_proj", "c_fc"]}`, ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"o", "up"}, Alpha: 8, FP32: true}},
		{"phi3 fused", "phi-3-mini-4k.json", `{"peft_type": "LORA", "r": 4, "target_modules": ["qkv_proj", "gate_up_proj"]}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "k", "v", "gate", "up"}, Alpha: 8, FP32: true}},
		{"starcoder2 c_proj: the MLP's", "starcoder2-3b.json", `{"peft_type": "LORA", "r": 4, "target_modules": ["c_proj", "q_proj"]}`,
			ir.LoRA{Rank: 4, Targets: []ir.LoRATarget{"q", "down"}, Alpha: 8, FP32: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := hfModel(t, tt.base)
			if err := ApplyPEFTAdapter(m, "adapter_config.json", []byte(tt.json)); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, m.Training.LoRA); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if err := m.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestApplyPEFTAdapterRefuses: what trains besides the adapters, what
// adapts nothing ckptplan builds or some layers only, and what is not
// LoRA, each named at its line.
func TestApplyPEFTAdapterRefuses(t *testing.T) {
	tests := []struct{ name, base, json, want string }{
		{"not an object", "llama-3.2-1b.json", `[1]`, "adapter_config.json:1:1: want a JSON object"},
		{"no peft_type", "llama-3.2-1b.json", `{"r": 8}`, "no peft_type: not a PEFT adapter_config.json"},
		{"prefix tuning", "llama-3.2-1b.json", `{"peft_type": "PREFIX_TUNING"}`, `adapter_config.json:1:15: peft_type "PREFIX_TUNING": ckptplan plans LoRA adapters`},
		{"rank 0", "llama-3.2-1b.json", `{"peft_type": "LORA",` + "\n" + `"r": 0}`, "adapter_config.json:2:6: r: the adapters' rank must be positive, got 0"},
		{"rank a string", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": "8"}`, `r: want a whole number, got the string "8"`},
		{"dropout 1", "llama-3.2-1b.json", `{"peft_type": "LORA", "lora_dropout": 1}`, "lora_dropout: must be in [0, 1), got 1"},
		{"dora", "llama-3.2-1b.json", `{"peft_type": "LORA", "use_dora": true}`, "use_dora: DoRA"},
		{"bias", "llama-3.2-1b.json", `{"peft_type": "LORA", "bias": "all"}`, `bias "all" trains the model's biases`},
		{"rank pattern", "llama-3.2-1b.json", `{"peft_type": "LORA", "rank_pattern": {"q_proj": 16}}`, "rank_pattern gives some modules a rank of their own"},
		{"modules to save", "llama-3.2-1b.json", `{"peft_type": "LORA", "modules_to_save": ["lm_head"]}`, `modules_to_save ["lm_head"] trains more than the adapters`},
		{"some layers", "llama-3.2-1b.json", `{"peft_type": "LORA", "layers_to_transform": [0, 1]}`, "layers_to_transform adapts some layers only"},
		{"trainable tokens", "llama-3.2-1b.json", `{"peft_type": "LORA", "trainable_token_indices": [5]}`, "trainable_token_indices trains rows of the embeddings"},
		{"lm_head", "llama-3.2-1b.json", `{"peft_type": "LORA", "target_modules": ["q_proj", "lm_head"]}`, `target_modules: "lm_head" names no linear of a llama decoder layer (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)`},
		{"gpt2's names on llama", "llama-3.2-1b.json", `{"peft_type": "LORA", "target_modules": ["c_attn"]}`, `"c_attn" names no linear of a llama decoder layer`},
		{"a pattern over some layers", "llama-3.2-1b.json", `{"peft_type": "LORA", "target_modules": "model\\.layers\\.[0-3]\\.self_attn\\.q_proj"}`, "adapts q in layer 0 but nothing in layer 4: ckptplan plans LoRA alike in every layer"},
		{"a pattern RE2 does not read", "llama-3.2-1b.json", `{"peft_type": "LORA", "target_modules": "(?!mlp).*_proj"}`, "is not a regular expression ckptplan reads"},
		{"no PEFT default", "phi-3-mini-4k.json", `{"peft_type": "LORA"}`, "PEFT has no default for the phi3 family: name them (qkv_proj, o_proj, gate_up_proj, down_proj)"},
		{"targets a number", "llama-3.2-1b.json", `{"peft_type": "LORA", "target_modules": 3}`, "target_modules: want a list of module names or a regular expression, got the value 3"},
		{"a key twice", "llama-3.2-1b.json", `{"peft_type": "LORA", "r": 8, "r": 16}`, `"r"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := hfModel(t, tt.base)
			err := ApplyPEFTAdapter(m, "adapter_config.json", []byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if _, ok := err.(*PosError); !ok {
				t.Errorf("error %q is a %T, want a *PosError", err, err)
			}
		})
	}
}

// TestLoadModelFolder loads a folder as transformers and PEFT save one:
// config.json alone, with adapter_config.json beside it, and an adapter
// folder whose base_model_name_or_path is the base model's folder.
func TestLoadModelFolder(t *testing.T) {
	dir := t.TempDir()
	config, err := os.ReadFile(filepath.Join("testdata", "hf", "llama-3.2-1b.json"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base, tuned, adapter := filepath.Join(dir, "base"), filepath.Join(dir, "tuned"), filepath.Join(dir, "adapter")
	write(filepath.Join(base, "config.json"), string(config))
	write(filepath.Join(tuned, "config.json"), string(config))
	const lora = `{"peft_type": "LORA", "r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "base_model_name_or_path": %q}`
	write(filepath.Join(tuned, "adapter_config.json"), strings.Replace(lora, "%q", `"meta-llama/Llama-3.2-1B"`, 1))
	write(filepath.Join(adapter, "adapter_config.json"), strings.Replace(lora, "%q", `"`+base+`"`, 1))

	src, err := Load(base)
	if err != nil {
		t.Fatal(err)
	}
	if src.Model.Training.LoRA.Rank != 0 || src.Name != base {
		t.Errorf("the base folder: LoRA %+v, name %q", src.Model.Training.LoRA, src.Name)
	}
	want := ir.LoRA{Rank: 16, Targets: []ir.LoRATarget{"q", "k", "v", "o"}, Alpha: 8, FP32: true}
	for _, folder := range []string{tuned, adapter} {
		src, err := Load(folder)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, src.Model.Training.LoRA); diff != "" {
			t.Errorf("%s (-want +got)\n%s", folder, diff)
		}
		if src.SHA256 == "" || src.Kind != KindModel {
			t.Errorf("%s: kind %v, digest %q", folder, src.Kind, src.SHA256)
		}
	}
	tunedSrc, _ := Load(tuned)
	baseSrc, _ := Load(base)
	if tunedSrc.SHA256 == baseSrc.SHA256 {
		t.Error("the adapter does not change the folder's digest")
	}

	// An adapter folder whose base is on the hub, and a folder of neither.
	write(filepath.Join(dir, "hub", "adapter_config.json"), strings.Replace(lora, "%q", `"meta-llama/Llama-3.2-1B"`, 1))
	write(filepath.Join(dir, "empty", "README.md"), "")
	for _, tt := range []struct{ folder, want string }{
		{"hub", `a PEFT adapter without a config.json beside it, and its base model "meta-llama/Llama-3.2-1B" is no local folder with one: put the base model's config.json in`},
		{"empty", "a folder without config.json"},
	} {
		_, err := Load(filepath.Join(dir, tt.folder))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one containing %q", tt.folder, err, tt.want)
		}
	}
}

// TestLoRATargetsNamed: --lora-targets takes ckptplan's roles, PEFT's
// module names for the family and all-linear.
func TestLoRATargetsNamed(t *testing.T) {
	tests := []struct {
		base  string
		names []string
		want  []ir.LoRATarget
		err   string
	}{
		{"llama-3.2-1b.json", []string{"q", "v"}, []ir.LoRATarget{"q", "v"}, ""},
		{"llama-3.2-1b.json", []string{"q_proj", "v_proj", "o"}, []ir.LoRATarget{"o", "q", "v"}, ""},
		{"llama-3.2-1b.json", []string{"all-linear"}, []ir.LoRATarget{"q", "k", "v", "o", "gate", "up", "down"}, ""},
		{"gpt2.json", []string{"c_attn"}, []ir.LoRATarget{"q", "k", "v"}, ""},
		{"llama-3.2-1b.json", []string{"wq"}, nil, `"wq" names no linear of a llama decoder layer`},
		{"llama-3.2-1b.json", []string{"q", ""}, nil, "an empty name"},
	}
	for _, tt := range tests {
		got, err := LoRATargetsNamed(hfModel(t, tt.base), tt.names)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%v: error %v, want %q", tt.names, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tt.names, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%v (-want +got)\n%s", tt.names, diff)
		}
	}
}

func FuzzApplyPEFTAdapter(f *testing.F) {
	for _, s := range []string{
		`{"peft_type": "LORA", "r": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.1}`,
		`{"peft_type": "LORA", "target_modules": ".*\\.(q|o)_proj", "exclude_modules": "x"}`,
		`{"peft_type": "LORA", "target_modules": "all-linear", "rank_pattern": {}, "layers_to_transform": null}`,
	} {
		f.Add([]byte(s))
	}
	m := hfModel(f, "llama-3.2-1b.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		c := *m
		if err := ApplyPEFTAdapter(&c, "adapter_config.json", data); err != nil {
			if _, ok := err.(*PosError); !ok {
				t.Fatalf("error %q is a %T, want a *PosError", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("an adapter read without error does not validate: %v", err)
		}
	})
}
