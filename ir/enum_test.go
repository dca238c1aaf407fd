package ir

import (
	"encoding/json"
	"flag"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// enumCase is one enumerated type under test: a fresh value of it, its
// values as Set takes them and the listing its errors give.
type enumCase struct {
	name    string
	zero    func() flag.Value
	values  []string
	listing string
}

func newEnumCase[T ~string, P interface {
	*T
	flag.Value
}](name string, valid []T, listing string) enumCase {
	values := make([]string, len(valid))
	for i, v := range valid {
		values[i] = string(v)
	}
	return enumCase{name, func() flag.Value { return P(new(T)) }, values, listing}
}

// TestEnumSet: each type's Set takes every value it lists, after which
// String gives it back, and refuses another with today's listing,
// leaving the value as it was.
func TestEnumSet(t *testing.T) {
	for _, tt := range []enumCase{
		newEnumCase("AttentionKernel", Attentions(), "eager, sdpa, sdpa-math, flash"),
		newEnumCase("Profile", Profiles(), "transformers, torch-eager, megatron"),
		newEnumCase("Optimizer", Optimizers(), "adamw, adamw-foreach, adamw-fused, adamw-forloop, adamw8bit, paged-adamw8bit, paged-adamw, sgd, none"),
		newEnumCase("Quant", Quants(), "nf4, fp4, int8"),
		newEnumCase("GQA", GQAs(), "repeat, grouped"),
		newEnumCase("Sharding", Shardings(), "deepspeed, fsdp2"),
		newEnumCase("Reshard", Reshards(), "all, all-but-last"),
		newEnumCase("LoRATarget", LoRATargets(), "q, k, v, o, gate, up, down"),
		newEnumCase("MasterWeights", MasterWeightsValues(), "fp32, none"),
	} {
		t.Run(tt.name, func(t *testing.T) {
			testEnum(t, tt)
		})
	}
}

func testEnum(t *testing.T, tt enumCase) {
	t.Helper()
	if len(tt.values) == 0 {
		t.Fatal("no values")
	}
	for _, v := range tt.values {
		f := tt.zero()
		if err := f.Set(v); err != nil {
			t.Errorf("Set(%q): %v", v, err)
		}
		if got := f.String(); got != v {
			t.Errorf("Set(%q), then String() = %q", v, got)
		}
	}
	for _, bad := range []string{"", "bogus", tt.values[0] + " "} {
		f := tt.zero()
		if err := f.Set(tt.values[0]); err != nil {
			t.Fatal(err)
		}
		err := f.Set(bad)
		want := `unknown value "` + bad + `" (valid: ` + tt.listing + ")"
		if err == nil || err.Error() != want {
			t.Errorf("Set(%q) = %v, want %s", bad, err, want)
		}
		if got := f.String(); got != tt.values[0] {
			t.Errorf("a refused Set(%q) changed the value to %q", bad, got)
		}
	}
}

// TestSetupValidateListings: validation names a field's valid values as
// its type's Set does.
func TestSetupValidateListings(t *testing.T) {
	for _, tt := range []struct {
		set  func(*Setup)
		want string
	}{
		{func(s *Setup) { s.Attention = "sdpa2" }, `training.attention: unknown value "sdpa2" (valid: eager, sdpa, sdpa-math, flash)`},
		{func(s *Setup) { s.Profile = "pytorch" }, `training.profile: unknown value "pytorch" (valid: transformers, torch-eager, megatron)`},
		{func(s *Setup) { s.Optimizer = "adam" }, `training.optimizer: unknown value "adam" (valid: adamw, adamw-foreach, adamw-fused, adamw-forloop, adamw8bit, paged-adamw8bit, paged-adamw, sgd, none)`},
		{func(s *Setup) { s.Quant, s.LoRA.Rank = "nf8", 8 }, `training.quant: unknown value "nf8" (valid: nf4, fp4, int8)`},
		{func(s *Setup) { s.Numerics.GQA = "" }, `training.numerics.gqa: unknown value "" (valid: repeat, grouped)`},
		{func(s *Setup) { s.Parallel.Zero, s.Parallel.Sharding = 3, "zero-infinity" }, `training.parallel.sharding: unknown value "zero-infinity" (valid: deepspeed, fsdp2)`},
		{func(s *Setup) { s.Parallel.Zero, s.Parallel.Reshard = 3, "last" }, `training.parallel.reshard: unknown value "last" (valid: all, all-but-last)`},
		{func(s *Setup) { s.Parallel.Zero, s.Parallel.Reshard = 2, ReshardAllButLast }, "training.parallel.reshard: all-but-last is FSDP2's resharding (fully_shard): it needs zero 3 with the fsdp2 sharding"},
		{func(s *Setup) {
			s.Parallel.Zero, s.Parallel.Sharding, s.Parallel.Reshard = 3, ShardingDeepSpeed, ReshardAllButLast
		}, "training.parallel.reshard: all-but-last is FSDP2's resharding (fully_shard): it needs zero 3 with the fsdp2 sharding"},
		{func(s *Setup) { s.LoRA.Targets = []LoRATarget{LoRAQ, "qkv"} }, `training.lora.targets[1]: unknown value "qkv" (valid: q, k, v, o, gate, up, down)`},
		{func(s *Setup) { s.MasterWeights = "fp16" }, `training.master_weights: unknown value "fp16" (valid: fp32, none)`},
		{func(s *Setup) { s.DoubleQuant, s.Quant, s.LoRA.Rank = true, QuantInt8, 8 }, "training.double_quant: double quantization is of 4-bit weights' constants: it needs quant nf4 or fp4"},
	} {
		s := DefaultSetup()
		tt.set(&s)
		if err := s.Validate("training"); err == nil || err.Error() != tt.want {
			t.Errorf("Validate() = %v, want %s", err, tt.want)
		}
	}
	s := DefaultSetup()
	s.Quant, s.DoubleQuant, s.LoRA.Rank = QuantFP4, true, 8
	if err := s.Validate("training"); err != nil {
		t.Errorf("fp4 with double quantization: %v", err)
	}
}

// TestSetupValidateDTypeNames: a setup may name its dtypes as PyTorch
// does (float32, bfloat16); Validate accepts them, autocast over float32
// included, and writes the short names every reader compares.
func TestSetupValidateDTypeNames(t *testing.T) {
	for _, tt := range []struct{ dtype, autocast, wantDType, wantAutocast string }{
		{"float32", "bfloat16", "fp32", "bf16"},
		{"float", "float16", "fp32", "fp16"},
		{"bfloat16", "", "bf16", ""},
		{"half", "", "fp16", ""},
		{"fp32", "bf16", "fp32", "bf16"},
	} {
		s := DefaultSetup()
		s.DType, s.Autocast = tt.dtype, tt.autocast
		if err := s.Validate("training"); err != nil {
			t.Errorf("dtype %s, autocast %q: %v", tt.dtype, tt.autocast, err)
			continue
		}
		if s.DType != tt.wantDType || s.Autocast != tt.wantAutocast {
			t.Errorf("dtype %s, autocast %q: written as %s, %q; want %s, %q", tt.dtype, tt.autocast, s.DType, s.Autocast, tt.wantDType, tt.wantAutocast)
		}
	}
	s := DefaultSetup()
	s.DType, s.Autocast = "bfloat16", "fp16"
	want := "training.autocast: autocast runs over fp32 weights, but dtype is bfloat16"
	if err := s.Validate("training"); err == nil || err.Error() != want {
		t.Errorf("autocast over bfloat16: %v, want %s", err, want)
	}
}

// setupEncodingCase is a setup with every enumerated field given.
func setupEncodingCase() Setup {
	s := DefaultSetup()
	s.Attention, s.Profile = AttentionSDPA, ProfileTransformers
	s.Numerics.GQA = GQAGrouped
	s.Optimizer = OptimizerPagedAdamW8bit
	s.LoRA = LoRA{Rank: 8, Targets: []LoRATarget{LoRAQ, LoRAV}, Alpha: 16}
	s.Quant, s.DoubleQuant = QuantNF4, true
	s.Parallel = Parallel{DP: 2, TP: 1, Zero: 3, Sharding: ShardingFSDP2}
	s.MasterWeights = MasterNone
	return s
}

// TestSetupEncoding: the enumerated fields encode as plain strings, in
// JSON and YAML, and decode back.
func TestSetupEncoding(t *testing.T) {
	s := setupEncodingCase()
	const wantJSON = `{"batch":1,"seq":2048,"dtype":"bf16","dropout":0,"attention":"sdpa","profile":"transformers",` +
		`"numerics":{"norm_fp32":true,"softmax_fp32":true,"logits_fp32":false,"gqa":"grouped"},` +
		`"optimizer":"paged-adamw8bit","lora":{"rank":8,"targets":["q","v"],"dropout":0,"alpha":16},"quant":"nf4","double_quant":true,` +
		`"parallel":{"dp":2,"tp":1,"sp":false,"zero":3,"sharding":"fsdp2"},"master_weights":"none"}`
	const wantYAML = `batch: 1
seq: 2048
dtype: bf16
dropout: 0
attention: sdpa
profile: transformers
numerics:
    norm_fp32: true
    softmax_fp32: true
    logits_fp32: false
    gqa: grouped
optimizer: paged-adamw8bit
lora:
    rank: 8
    targets:
        - q
        - v
    dropout: 0
    alpha: 16
quant: nf4
double_quant: true
parallel:
    dp: 2
    tp: 1
    sp: false
    zero: 3
    sharding: fsdp2
master_weights: none
`
	j, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantJSON, string(j)); diff != "" {
		t.Errorf("JSON (-want +got)\n%s", diff)
	}
	y, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantYAML, string(y)); diff != "" {
		t.Errorf("YAML (-want +got)\n%s", diff)
	}
	var fromJSON, fromYAML Setup
	if err := json.Unmarshal([]byte(wantJSON), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(wantYAML), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, fromJSON); diff != "" {
		t.Errorf("decoded from JSON (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff(s, fromYAML); diff != "" {
		t.Errorf("decoded from YAML (-want +got)\n%s", diff)
	}
}

func TestSharder(t *testing.T) {
	for _, tt := range []struct {
		p    Parallel
		want Sharding
	}{
		{Parallel{}, ""},
		{Parallel{Zero: 1}, ShardingDeepSpeed},
		{Parallel{Zero: 3}, ShardingFSDP2},
		{Parallel{Zero: 3, Sharding: ShardingDeepSpeed}, ShardingDeepSpeed},
		{Parallel{Sharding: ShardingFSDP2}, ""},
	} {
		if got := tt.p.Sharder(); got != tt.want {
			t.Errorf("%+v: Sharder() = %q, want %q", tt.p, got, tt.want)
		}
	}
}
