package ir

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Setup is how a model is trained: the sizes of a step, numerics, the
// framework profile whose rules say what autograd keeps, optimizer, LoRA
// and parallelism. The cost model gives these fields their meaning.
type Setup struct {
	Batch     int64           `yaml:"batch" json:"batch"`
	Seq       int64           `yaml:"seq" json:"seq"`
	DType     string          `yaml:"dtype" json:"dtype"`         // fp32 | bf16 | fp16
	Dropout   float64         `yaml:"dropout" json:"dropout"`     // in [0, 1)
	Attention AttentionKernel `yaml:"attention" json:"attention"` // eager | sdpa | sdpa-math | flash
	Profile   Profile         `yaml:"profile" json:"profile"`     // transformers | torch-eager | megatron
	// Transformers is the transformers release the transformers profile
	// plans for ("5.24"), whose rules set the release-dependent numerics
	// (graphio.Releases); "" where the numerics are given as written.
	Transformers string `yaml:"transformers,omitempty" json:"transformers,omitempty"`
	// Autocast is the 16-bit dtype torch.autocast computes products in
	// over fp32 weights (DType fp32), "" without autocast.
	Autocast string `yaml:"autocast,omitempty" json:"autocast,omitempty"`
	// Padded: the step's batches carry an attention mask that pads
	// shorter sequences (a collator pads each batch to its longest), so
	// that transformers hands every layer's sdpa the model's mask.
	Padded   bool     `yaml:"padded,omitempty" json:"padded,omitempty"`
	Numerics Numerics `yaml:"numerics" json:"numerics"`
	// Optimizer is the optimizer and, for PyTorch's AdamW, how its step
	// runs: adamw is PyTorch's default on a GPU, adamw-foreach;
	// adamw-fused and adamw-forloop are its fused=True and foreach=False.
	Optimizer Optimizer `yaml:"optimizer" json:"optimizer"` // one of Optimizers
	LoRA      LoRA      `yaml:"lora" json:"lora"`
	// Quant is how the decoder layers' frozen linear weights are stored
	// (bitsandbytes, as QLoRA trains): nf4 or fp4 (4 bits, blocks of 64
	// with an fp32 absolute maximum each), int8 (LLM.int8(): a byte and
	// an fp32 scale a row); "" for the training dtype. Adapters train
	// over them (LoRA rank > 0).
	Quant Quant `yaml:"quant,omitempty" json:"quant,omitempty"`
	// DoubleQuant quantizes the 4-bit blocks' absolute maxima again, to a
	// byte each in blocks of 256 with an fp32 maximum (QLoRA's double
	// quantization).
	DoubleQuant bool     `yaml:"double_quant,omitempty" json:"double_quant,omitempty"`
	Parallel    Parallel `yaml:"parallel" json:"parallel"`
	// GradAccum is how many micro-batches a step accumulates gradients
	// over before the optimizer runs (0 and 1: none). From the second on,
	// every gradient is live through the whole micro-step, and each new
	// one is added into it.
	GradAccum int64 `yaml:"grad_accum,omitempty" json:"grad_accum,omitempty"`
	// MasterWeights is what PyTorch's optimizers keep of 16-bit trained
	// weights: "fp32" (the default), an fp32 master copy and fp32 moments,
	// as mixed-precision trainers run them (DeepSpeed, Megatron-LM); or
	// "none", moments in the weights' own dtype and no copy, as PyTorch's
	// AdamW and SGD do over 16-bit parameters.
	MasterWeights MasterWeights `yaml:"master_weights,omitempty" json:"master_weights,omitempty"`
	// BuffersBytes are the bytes of the model's registered buffers (the
	// rotary modules' inverse frequencies and cached tables, a causal
	// mask), as a live model holds them: the Python package measures
	// them. 0: modeled from the config (the rotary modules' buffers).
	BuffersBytes int64 `yaml:"buffers_bytes,omitempty" json:"buffers_bytes,omitempty"`
}

// Numerics are the upcasts and the grouped-query implementation, which
// change what autograd keeps.
type Numerics struct {
	NormFP32    bool `yaml:"norm_fp32" json:"norm_fp32"`       // RMSNorm computes in fp32 (HF default)
	SoftmaxFP32 bool `yaml:"softmax_fp32" json:"softmax_fp32"` // softmax in fp32, cast back
	LogitsFP32  bool `yaml:"logits_fp32" json:"logits_fp32"`   // loss on logits.float()
	GQA         GQA  `yaml:"gqa" json:"gqa"`                   // repeat (expand K, V) | grouped
	// RopeInLayer: each layer computes its rotary cos/sin tables itself
	// (Mistral in transformers before 4.48), so they are its activations.
	RopeInLayer bool `yaml:"rope_in_layer,omitempty" json:"rope_in_layer,omitempty"`
	// RopeCached: each layer slices and indexes cos/sin tables it holds
	// for every position (Mixtral in transformers before 4.48): copies
	// kept as RopeInLayer's are, made without a product; the tables are
	// the layer's buffers.
	RopeCached bool `yaml:"rope_cached,omitempty" json:"rope_cached,omitempty"`
	// SDPAContiguous: q, k and v are made contiguous before sdpa (copies
	// of strided ones), whose output is then [b, heads, s, d], so that
	// merging the heads copies it (transformers 4.48 and later); before,
	// sdpa took views and laid its output out [b, s, heads, d].
	SDPAContiguous bool `yaml:"sdpa_contiguous,omitempty" json:"sdpa_contiguous,omitempty"`
	// SDPAGQA: with fewer key/value heads than query heads, sdpa takes K
	// and V unexpanded (enable_gqa) in a layer that passes it no mask,
	// instead of their repeat_kv copies (transformers 4.54 and later).
	SDPAGQA bool `yaml:"sdpa_gqa,omitempty" json:"sdpa_gqa,omitempty"`
	// SDPAGQAMath: sdpa's fused kernel takes no enable_gqa (PyTorch's CPU
	// kernel before 2.8 at least): where K and V come unexpanded, sdpa
	// runs its math path, repeating them itself. The Python package asks
	// the live PyTorch.
	SDPAGQAMath bool `yaml:"sdpa_gqa_math,omitempty" json:"sdpa_gqa_math,omitempty"`
	// ModelMasks: the model makes every layer's attention mask
	// (transformers' masking_utils, 4.53 and later). Under sdpa a layer
	// then gets none, causal attention being sdpa's is_causal, unless
	// its window is no longer than the sequence, and keeps no mask of
	// its own; before, Gemma 2's layers were always handed one.
	ModelMasks bool `yaml:"model_masks,omitempty" json:"model_masks,omitempty"`
	// Phi3RopeCat: Phi-3's rotary embedding concatenates its rotated and
	// passed-through parts (transformers 4.48 and later), so its q is a
	// contiguous [b, heads, s, d], not laid out as the projection's
	// [b, s, heads, d]; sdpa lays its output out as its q.
	Phi3RopeCat bool `yaml:"phi3_rope_cat,omitempty" json:"phi3_rope_cat,omitempty"`
	// GPT2FloatScale: GPT-2's eager attention scales its scores by a
	// Python float (transformers 5.4 and later), not by dividing by a
	// 0-dim tensor, which the division keeps.
	GPT2FloatScale bool `yaml:"gpt2_float_scale,omitempty" json:"gpt2_float_scale,omitempty"`
	// GPT2AdditiveMask: GPT-2's eager attention adds the model's mask to
	// its scores (transformers 5.2 and later), as Llama's does, instead
	// of torch.where over its causal buffer.
	GPT2AdditiveMask bool `yaml:"gpt2_additive_mask,omitempty" json:"gpt2_additive_mask,omitempty"`
	// GPT2LossModelDType: GPT-2's loss is its own CrossEntropyLoss over
	// the logits in the model's dtype, whatever LogitsFP32 says
	// (transformers before 4.48; later releases share the loss of the
	// other families, which upcasts).
	GPT2LossModelDType bool `yaml:"gpt2_loss_model_dtype,omitempty" json:"gpt2_loss_model_dtype,omitempty"`
	// Phi3AttnOutputs: Phi-3's decoder layer holds its attention's output
	// (attn_outputs) to its end, through the MLP (transformers before
	// 4.48; later releases rebind hidden_states to it).
	Phi3AttnOutputs bool `yaml:"phi3_attn_outputs,omitempty" json:"phi3_attn_outputs,omitempty"`
	// GemmaScaleBuffer: Gemma and Gemma 2 scale their embeddings by a
	// registered 0-dim buffer (transformers 5.4 and later), in the
	// model's dtype as converting the model converts it, and cast to the
	// weights' dtype, which is then no copy: the product keeps the buffer
	// itself. Before, a 0-dim tensor in the model dtype made each
	// forward.
	GemmaScaleBuffer bool `yaml:"gemma_scale_buffer,omitempty" json:"gemma_scale_buffer,omitempty"`
	// LossShiftCopy: the causal LM loss copies the logits of the first
	// s−1 positions contiguous and takes the log-softmax of those
	// (transformers before 4.49); later releases pad the labels instead
	// and read all s positions in place.
	LossShiftCopy bool `yaml:"loss_shift_copy,omitempty" json:"loss_shift_copy,omitempty"`
	// CPUKernels: PyTorch's CPU kernels run the step (the Python package
	// on a CPU); otherwise CUDA's, whose layer norm over 16-bit inputs
	// keeps its statistics in fp32 and whose memory-efficient sdpa (fp32)
	// keeps its log-sum-exp padded to 32 positions.
	CPUKernels bool `yaml:"cpu_kernels,omitempty" json:"cpu_kernels,omitempty"`
	// ByteMasks: dropout keeps a 1-byte mask, as PyTorch's fused CUDA
	// kernel does; otherwise a mask in its input's dtype (the CPU kernel).
	ByteMasks bool `yaml:"byte_masks,omitempty" json:"byte_masks,omitempty"`
}

// LoRA describes low-rank adapters. Rank 0 means full fine-tuning.
type LoRA struct {
	Rank    int64        `yaml:"rank" json:"rank"`
	Targets []LoRATarget `yaml:"targets" json:"targets"` // of q, k, v, o, gate, up, down
	Dropout float64      `yaml:"dropout" json:"dropout"` // dropout on each adapter's input
	// Alpha is PEFT's lora_alpha, the numerator of the adapters' output
	// scale (alpha/rank). It changes no byte and no FLOP of the step; the
	// plan prints it with the rest of the setup it assumes.
	Alpha float64 `yaml:"alpha" json:"alpha"`
	// FP32: the adapters' weights are fp32 over 16-bit base weights, as
	// PEFT makes them by default (autocast_adapter_dtype).
	FP32 bool `yaml:"fp32,omitempty" json:"fp32,omitempty"`
}

// Parallel is the data, tensor and sequence parallel layout and the ZeRO
// stage (0 to 3; 3 is FSDP's full sharding).
type Parallel struct {
	DP   int64 `yaml:"dp" json:"dp"`
	TP   int64 `yaml:"tp" json:"tp"`
	SP   bool  `yaml:"sp" json:"sp"`
	Zero int64 `yaml:"zero" json:"zero"`
	// NoSync: gradients are reduced once an optimizer step, after its last
	// microbatch (DDP's no_sync, FSDP2's set_requires_gradient_sync(False),
	// Accelerate's gradient accumulation under FSDP), so each rank holds
	// them whole, unsharded, between microbatches.
	NoSync bool `yaml:"no_sync,omitempty" json:"no_sync,omitempty"`
	// Sharding is the engine that runs ZeRO, whose buffers and optimizer
	// step the cost model counts: deepspeed (DeepSpeed's ZeRO, configured
	// as its export writes) or fsdp2 (PyTorch's fully_shard: stage 3).
	// "" is the stage's usual engine (Sharder).
	Sharding Sharding `yaml:"sharding,omitempty" json:"sharding,omitempty"`
	// Reshard is which decoder layers FSDP2 reshards after their forward:
	// all (fully_shard's default; "" too) or all-but-last, whose last
	// layer keeps its weights gathered from its forward to its backward.
	Reshard Reshard `yaml:"reshard,omitempty" json:"reshard,omitempty"`
}

// Sharder returns the engine that runs ZeRO: Sharding, or where it is
// unset deepspeed for stages 1 and 2 and fsdp2 for stage 3; "" without
// ZeRO.
func (p Parallel) Sharder() Sharding {
	switch {
	case p.Zero <= 0:
		return ""
	case p.Sharding != "":
		return p.Sharding
	case p.Zero >= 3:
		return ShardingFSDP2
	}
	return ShardingDeepSpeed
}

// DefaultLoRAAlpha is PEFT's default lora_alpha (LoraConfig's).
const DefaultLoRAAlpha = 8

// DefaultSetup returns the defaults of every training field.
func DefaultSetup() Setup {
	return Setup{
		Batch: 1, Seq: 2048, DType: "bf16", Attention: AttentionEager, Profile: ProfileTorchEager,
		Numerics:  Numerics{NormFP32: true, SoftmaxFP32: true, GQA: GQARepeat},
		Optimizer: OptimizerAdamW,
		LoRA:      LoRA{FP32: true, Alpha: DefaultLoRAAlpha}, // the family's targets: graphio.DefaultLoRATargets
		Parallel:  Parallel{DP: 1, TP: 1},
	}
}

// FieldError is a problem with one field of a setup or model, named by its
// path as written in YAML ("training.parallel.tp"), so that a reader can
// point at the line.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// ErrTooLarge is wrapped by the errors of a model or graph whose sizes
// pass what int64 counts: no device holds it.
var ErrTooLarge = errors.New("too large to count")

// ModelDType returns the parsed training dtype.
func (s *Setup) ModelDType() DType {
	d, _ := ParseDType(s.DType)
	return d
}

// Validate checks every field; prefix is prepended to field names in
// errors ("training"). It writes the dtypes by their short names
// (float32 and float are fp32, bfloat16 is bf16), as every reader of the
// setup compares them.
func (s *Setup) Validate(prefix string) error {
	f := func(name string) string { return prefix + "." + name }
	positive := []struct {
		name string
		v    int64
	}{{"batch", s.Batch}, {"seq", s.Seq}, {"parallel.dp", s.Parallel.DP}, {"parallel.tp", s.Parallel.TP}}
	for _, p := range positive {
		if p.v <= 0 {
			return &FieldError{f(p.name), fmt.Sprintf("must be positive, got %d", p.v)}
		}
	}
	d, err := ParseDType(s.DType)
	if err != nil || !slices.Contains(TrainDTypes, d) {
		return &FieldError{f("dtype"), fmt.Sprintf("unknown value %q (valid: fp32, bf16, fp16)", s.DType)}
	}
	written := s.DType
	s.DType = d.String()
	if s.Autocast != "" {
		a, err := ParseDType(s.Autocast)
		if err != nil || !(a == BF16 || a == FP16) {
			return &FieldError{f("autocast"), fmt.Sprintf("unknown value %q (valid: bf16, fp16)", s.Autocast)}
		}
		s.Autocast = a.String()
		if d != FP32 {
			return &FieldError{f("autocast"), fmt.Sprintf("autocast runs over fp32 weights, but dtype is %s", written)}
		}
	}
	if s.Quant != "" {
		if err := oneOf(f("quant"), s.Quant, Quants()); err != nil {
			return err
		}
		if s.LoRA.Rank <= 0 {
			return &FieldError{f("quant"), fmt.Sprintf("%s base weights are frozen: they train through LoRA adapters (QLoRA), so lora.rank must be positive", s.Quant)}
		}
	}
	if s.DoubleQuant && !s.Quant.FourBit() {
		return &FieldError{f("double_quant"), "double quantization is of 4-bit weights' constants: it needs quant nf4 or fp4"}
	}
	if s.Dropout < 0 || s.Dropout >= 1 || s.Dropout != s.Dropout {
		return &FieldError{f("dropout"), fmt.Sprintf("must be in [0, 1), got %v", s.Dropout)}
	}
	for _, e := range []error{
		oneOf(f("attention"), s.Attention, Attentions()),
		oneOf(f("profile"), s.Profile, Profiles()),
		oneOf(f("optimizer"), s.Optimizer, Optimizers()),
		oneOf(f("numerics.gqa"), s.Numerics.GQA, GQAs()),
	} {
		if e != nil {
			return e
		}
	}
	if s.LoRA.Dropout < 0 || s.LoRA.Dropout >= 1 || s.LoRA.Dropout != s.LoRA.Dropout {
		return &FieldError{f("lora.dropout"), fmt.Sprintf("must be in [0, 1), got %v", s.LoRA.Dropout)}
	}
	if a := s.LoRA.Alpha; a != a || math.IsInf(a, 0) {
		return &FieldError{f("lora.alpha"), fmt.Sprintf("must be a finite number, got %v", a)}
	}
	if s.LoRA.Rank < 0 {
		return &FieldError{f("lora.rank"), fmt.Sprintf("must not be negative, got %d", s.LoRA.Rank)}
	}
	for i, t := range s.LoRA.Targets {
		if err := oneOf(fmt.Sprintf("%s[%d]", f("lora.targets"), i), t, LoRATargets()); err != nil {
			return err
		}
	}
	if s.GradAccum < 0 {
		return &FieldError{f("grad_accum"), fmt.Sprintf("must not be negative, got %d", s.GradAccum)}
	}
	if s.MasterWeights != "" {
		if err := oneOf(f("master_weights"), s.MasterWeights, MasterWeightsValues()); err != nil {
			return err
		}
	}
	if s.BuffersBytes < 0 {
		return &FieldError{f("buffers_bytes"), fmt.Sprintf("must not be negative, got %d", s.BuffersBytes)}
	}
	if s.Parallel.Zero < 0 || s.Parallel.Zero > 3 {
		return &FieldError{f("parallel.zero"), fmt.Sprintf("must be 0, 1, 2 or 3, got %d", s.Parallel.Zero)}
	}
	if sh := s.Parallel.Sharding; sh != "" {
		if err := oneOf(f("parallel.sharding"), sh, Shardings()); err != nil {
			return err
		}
		switch {
		case s.Parallel.Zero == 0:
			return &FieldError{f("parallel.sharding"), fmt.Sprintf("%s runs ZeRO: set parallel.zero to 1, 2 or 3, or leave sharding unset", sh)}
		case s.Profile == ProfileMegatron:
			return &FieldError{f("parallel.sharding"), "the megatron profile shards through Megatron-LM's distributed optimizer: leave sharding unset"}
		case sh == ShardingFSDP2 && s.Parallel.Zero < 3:
			return &FieldError{f("parallel.sharding"), fmt.Sprintf("fsdp2 (fully_shard) runs ZeRO stage 3, not %d: use deepspeed, or zero 3", s.Parallel.Zero)}
		}
	}
	if r := s.Parallel.Reshard; r != "" {
		if err := oneOf(f("parallel.reshard"), r, Reshards()); err != nil {
			return err
		}
		if r != ReshardAll && (s.Parallel.Sharder() != ShardingFSDP2 || s.Profile == ProfileMegatron) {
			return &FieldError{f("parallel.reshard"), fmt.Sprintf("%s is FSDP2's resharding (fully_shard): it needs zero 3 with the fsdp2 sharding", r)}
		}
	}
	if s.Parallel.SP && s.Parallel.TP == 1 {
		return &FieldError{f("parallel.sp"), "sequence parallelism needs tp > 1"}
	}
	return nil
}
