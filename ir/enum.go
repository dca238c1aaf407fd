package ir

import (
	"fmt"
	"slices"
	"strings"
)

// The setup's enumerated fields are string types: each lists its values
// in one function, prints as itself, and parses with Set, so that a
// pointer to one is a flag.Value and validation reports the same list.
// They marshal as plain strings in YAML and JSON.

// AttentionKernel is the attention implementation a model runs:
// transformers' attn_implementation, or sdpa held to its math path.
type AttentionKernel string

// The attention kernels.
const (
	AttentionEager    AttentionKernel = "eager"     // products and softmax as separate ops
	AttentionSDPA     AttentionKernel = "sdpa"      // torch's scaled_dot_product_attention
	AttentionSDPAMath AttentionKernel = "sdpa-math" // sdpa's math path, which keeps what eager keeps
	AttentionFlash    AttentionKernel = "flash"     // a fused kernel that keeps no s² probabilities
)

// Attentions returns the attention kernels, in the order errors list them.
func Attentions() []AttentionKernel {
	return []AttentionKernel{AttentionEager, AttentionSDPA, AttentionSDPAMath, AttentionFlash}
}

// String returns a as written in YAML and on the command line.
func (a AttentionKernel) String() string { return string(a) }

// Set sets a to v, one of Attentions.
func (a *AttentionKernel) Set(v string) error { return SetOneOf(a, v, Attentions()) }

// Profile names the framework whose rules say what autograd keeps; the
// cost model gives each its meaning.
type Profile string

// The profiles.
const (
	ProfileTransformers Profile = "transformers"
	ProfileTorchEager   Profile = "torch-eager"
	ProfileMegatron     Profile = "megatron"
)

// Profiles returns the profiles, in the order errors list them.
func Profiles() []Profile {
	return []Profile{ProfileTransformers, ProfileTorchEager, ProfileMegatron}
}

// String returns p as written in YAML and on the command line.
func (p Profile) String() string { return string(p) }

// Set sets p to v, one of Profiles.
func (p *Profile) Set(v string) error { return SetOneOf(p, v, Profiles()) }

// Optimizer is the optimizer a step runs and, for PyTorch's AdamW, how.
type Optimizer string

// The optimizers.
const (
	OptimizerAdamW          Optimizer = "adamw"         // PyTorch's AdamW as it runs on a GPU: foreach
	OptimizerAdamWForeach   Optimizer = "adamw-foreach" // the same, named
	OptimizerAdamWFused     Optimizer = "adamw-fused"   // fused=True
	OptimizerAdamWForLoop   Optimizer = "adamw-forloop" // foreach=False
	OptimizerAdamW8bit      Optimizer = "adamw8bit"     // bitsandbytes' 8-bit AdamW
	OptimizerPagedAdamW8bit Optimizer = "paged-adamw8bit"
	OptimizerPagedAdamW     Optimizer = "paged-adamw"
	OptimizerSGD            Optimizer = "sgd"
	OptimizerNone           Optimizer = "none" // no optimizer step: gradients only
)

// Optimizers returns the optimizers, in the order errors list them.
func Optimizers() []Optimizer {
	return []Optimizer{OptimizerAdamW, OptimizerAdamWForeach, OptimizerAdamWFused, OptimizerAdamWForLoop,
		OptimizerAdamW8bit, OptimizerPagedAdamW8bit, OptimizerPagedAdamW, OptimizerSGD, OptimizerNone}
}

// String returns o as written in YAML and on the command line.
func (o Optimizer) String() string { return string(o) }

// Set sets o to v, one of Optimizers.
func (o *Optimizer) Set(v string) error { return SetOneOf(o, v, Optimizers()) }

// Quant is how frozen linear weights are stored (bitsandbytes); the zero
// value is the training dtype.
type Quant string

// The quantizations.
const (
	QuantNF4  Quant = "nf4"
	QuantFP4  Quant = "fp4"
	QuantInt8 Quant = "int8"
)

// Quants returns the quantizations, in the order errors list them.
func Quants() []Quant { return []Quant{QuantNF4, QuantFP4, QuantInt8} }

// String returns q as written in YAML and on the command line.
func (q Quant) String() string { return string(q) }

// Set sets q to v, one of Quants.
func (q *Quant) Set(v string) error { return SetOneOf(q, v, Quants()) }

// FourBit reports whether q stores 4-bit blocks (nf4, fp4), whose
// constants double quantization quantizes again.
func (q Quant) FourBit() bool { return q == QuantNF4 || q == QuantFP4 }

// GQA is how eager attention with fewer key/value heads than query heads
// runs.
type GQA string

// The grouped-query implementations.
const (
	GQARepeat  GQA = "repeat"  // expand K and V to every query head (repeat_kv)
	GQAGrouped GQA = "grouped" // read each key/value head for its group
)

// GQAs returns the grouped-query implementations, in the order errors
// list them.
func GQAs() []GQA { return []GQA{GQARepeat, GQAGrouped} }

// String returns g as written in YAML and on the command line.
func (g GQA) String() string { return string(g) }

// Set sets g to v, one of GQAs.
func (g *GQA) Set(v string) error { return SetOneOf(g, v, GQAs()) }

// Sharding is the engine that runs ZeRO.
type Sharding string

// The engines.
const (
	ShardingDeepSpeed Sharding = "deepspeed" // DeepSpeed's ZeRO, stages 1 to 3
	ShardingFSDP2     Sharding = "fsdp2"     // PyTorch's fully_shard: stage 3
)

// Shardings returns the engines, in the order errors list them.
func Shardings() []Sharding { return []Sharding{ShardingDeepSpeed, ShardingFSDP2} }

// String returns s as written in YAML and on the command line.
func (s Sharding) String() string { return string(s) }

// Set sets s to v, one of Shardings.
func (s *Sharding) Set(v string) error { return SetOneOf(s, v, Shardings()) }

// Reshard is which decoder layers FSDP2 reshards after their forward
// (fully_shard's reshard_after_forward, layer by layer).
type Reshard string

// The resharding policies.
const (
	// ReshardAll: every layer, fully_shard's default.
	ReshardAll Reshard = "all"
	// ReshardAllButLast: every layer but the last, whose weights stay
	// gathered from its forward to its backward (torchtitan 0.1's default
	// policy without pipeline parallelism).
	ReshardAllButLast Reshard = "all-but-last"
)

// Reshards returns the policies, in the order errors list them.
func Reshards() []Reshard { return []Reshard{ReshardAll, ReshardAllButLast} }

// String returns r as written in YAML and on the command line.
func (r Reshard) String() string { return string(r) }

// Set sets r to v, one of Reshards.
func (r *Reshard) Set(v string) error { return SetOneOf(r, v, Reshards()) }

// LoRATarget is a linear of a decoder layer that LoRA may adapt.
type LoRATarget string

// The LoRA targets.
const (
	LoRAQ    LoRATarget = "q"
	LoRAK    LoRATarget = "k"
	LoRAV    LoRATarget = "v"
	LoRAO    LoRATarget = "o"
	LoRAGate LoRATarget = "gate"
	LoRAUp   LoRATarget = "up"
	LoRADown LoRATarget = "down"
)

// LoRATargets returns the LoRA targets, in the order errors list them.
func LoRATargets() []LoRATarget {
	return []LoRATarget{LoRAQ, LoRAK, LoRAV, LoRAO, LoRAGate, LoRAUp, LoRADown}
}

// String returns t as written in YAML and on the command line.
func (t LoRATarget) String() string { return string(t) }

// Set sets t to v, one of LoRATargets.
func (t *LoRATarget) Set(v string) error { return SetOneOf(t, v, LoRATargets()) }

// MasterWeights is what PyTorch's optimizers keep of 16-bit trained
// weights; the zero value is MasterFP32.
type MasterWeights string

// The master weights.
const (
	MasterFP32 MasterWeights = "fp32" // an fp32 master copy and fp32 moments
	MasterNone MasterWeights = "none" // moments in the weights' dtype, no copy
)

// MasterWeightsValues returns the master weights, in the order errors
// list them.
func MasterWeightsValues() []MasterWeights { return []MasterWeights{MasterFP32, MasterNone} }

// String returns m as written in YAML and on the command line.
func (m MasterWeights) String() string { return string(m) }

// Set sets m to v, one of MasterWeightsValues.
func (m *MasterWeights) Set(v string) error { return SetOneOf(m, v, MasterWeightsValues()) }

// SetOneOf sets *dst to v if v is one of valid, and otherwise leaves it
// and says which are: `unknown value "x" (valid: a, b)`. It is the Set of
// every enumerated string type. O(len(valid)).
func SetOneOf[T ~string](dst *T, v string, valid []T) error {
	if err := checkOneOf(T(v), valid); err != nil {
		return err
	}
	*dst = T(v)
	return nil
}

func checkOneOf[T ~string](v T, valid []T) error {
	if slices.Contains(valid, v) {
		return nil
	}
	return fmt.Errorf("unknown value %q (valid: %s)", string(v), Join(valid, ", "))
}

// Join joins values with sep between them ("eager | sdpa").
func Join[T ~string](values []T, sep string) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return strings.Join(s, sep)
}

// oneOf checks a setup field's value against its type's values.
func oneOf[T ~string](field string, v T, valid []T) error {
	if err := checkOneOf(v, valid); err != nil {
		return &FieldError{field, err.Error()}
	}
	return nil
}

// indexedName returns the name of v, an index into names, or kind(v) for
// a value past the table: the String of the byte-sized enumerations.
func indexedName[T ~uint8](names []string, v T, kind string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, v)
}
