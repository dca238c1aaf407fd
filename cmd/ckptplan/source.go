package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// setupFlags are the training overrides shared by the commands that build
// a graph. Zero values leave the model's own settings.
type setupFlags struct {
	batch, seq int64
	dtype      string

	// Cost-model overrides, registered by addTrainingFlags.
	profile, attention string
	loraRank, tp, dp   int64
	zero               int64
	sp                 bool
	noSync             bool
	padded             bool
	sharding           string
	reshard            string
	gradAccum          int64
	buffersBytes       int64
	masterWeights      string
	dropout            float64
	logits             string
	loraTargets        string
	loraDropout        float64
	loraAlpha          float64
	loraDType          string
	ropeTables         string
	dropoutMask        string
	sdpaLayout         string
	gqaKernel          string
	kernels            string
	transformers       graphio.Release
	autocast           string
	optimizer, quant   string
	doubleQuant        bool
	training           map[string]bool // the flags addTrainingFlags registers
	set                map[string]bool // flags given on the command line (load)
}

func addSetupFlags(fs *flag.FlagSet) *setupFlags {
	s := &setupFlags{}
	fs.Int64Var(&s.batch, "batch", 0, "micro-batch size (default: the model's)")
	fs.Int64Var(&s.seq, "seq", 0, "sequence length in tokens (default: the model's)")
	fs.StringVar(&s.dtype, "dtype", "", "training dtype: fp32 | bf16 | fp16 (default: the model's)")
	return s
}

// addTrainingFlags registers the flags that change how a model trains.
func (s *setupFlags) addTrainingFlags(fs *flag.FlagSet) {
	before := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	defer func() {
		s.training = map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) {
			if !before[f.Name] {
				s.training[f.Name] = true
			}
		})
	}()
	fs.StringVar(&s.profile, "profile", "", "what autograd keeps: "+ir.Join(ir.Profiles(), " | ")+" (default: the model's)")
	fs.StringVar(&s.autocast, "autocast", "", "16-bit dtype torch.autocast computes products in over fp32 weights: bf16 | fp16 | none (default: the model's)")
	fs.StringVar(&s.attention, "attention", "", "attention kernel: "+ir.Join(ir.Attentions(), " | ")+", or transformers' attn_implementation (flash_attention_2 is flash) (default: the model's)")
	fs.Float64Var(&s.dropout, "dropout", 0, "dropout probability of attention and residuals (default: the model's)")
	fs.StringVar(&s.logits, "logits-dtype", "", "dtype the loss reads the logits in: fp32 (transformers' loss, which upcasts; GPT-2's own before 4.48 does not) | model (default: the model's, for a config.json its release's loss)")
	fs.Int64Var(&s.loraRank, "lora-rank", 0, "LoRA rank; 0 keeps the model's setting")
	fs.StringVar(&s.loraTargets, "lora-targets", "", "comma-separated linears LoRA adapts: q,k,v,o,gate,up,down, PEFT's module names for the family (q_proj, GPT-2's c_attn) or all-linear (default: the model's; for a config.json PEFT's default for its model type, q,v for Llama)")
	fs.StringVar(&s.dropoutMask, "dropout-mask", "", "what a dropout keeps: byte (a 1-byte mask: CUDA) | dtype (a mask in its input's dtype: CPU) (default: the model's)")
	fs.StringVar(&s.ropeTables, "rope-tables", "", "where rotary cos/sin are computed: model (once) | layer (each layer, Mistral before transformers 4.48) | cached (each layer indexes a cache of its own, Mixtral before 4.48)")
	fs.Func("transformers", "the transformers release the transformers profile plans for: "+graphio.Oldest.String()+" or later; its rules set --sdpa-layout and the other attention numerics (default: the model's; "+graphio.Newest.String()+" for a config.json)", func(v string) error {
		r, err := graphio.ParseRelease(v)
		s.transformers = r
		return err
	})
	fs.StringVar(&s.sdpaLayout, "sdpa-layout", "", "what transformers hands sdpa: views (q, k, v as they are) | contiguous (contiguous copies: 4.48 to 4.55) | legacy (a model's own Sdpa attention class: views, K and V repeated, masks of its own; every family before 4.48) (default: the release's)")
	fs.StringVar(&s.gqaKernel, "gqa-kernel", "", "what sdpa runs where transformers hands it K and V unexpanded (enable_gqa, 4.54 and later): fused (its fused kernel: CUDA's flash, PyTorch's CPU kernel in recent releases) | math (its math path, which repeats K and V: PyTorch's CPU kernel in 2.5 to 2.7) (default: fused)")
	fs.StringVar(&s.kernels, "kernels", "", "whose kernels run the step: cuda | cpu (PyTorch's CPU kernels keep a layer norm's statistics in 16 bits and sdpa's log-sum-exp unpadded) (default: the model's; cuda for a config.json)")
	fs.Float64Var(&s.loraDropout, "lora-dropout", 0, "dropout on each LoRA adapter's input (default: the model's)")
	fs.Float64Var(&s.loraAlpha, "lora-alpha", 0, "PEFT's lora_alpha, the adapters' output scale times the rank: printed, it changes no byte or FLOP (default: the model's; PEFT's 8)")
	fs.StringVar(&s.loraDType, "lora-dtype", "", "dtype of the LoRA adapters' weights: fp32 (PEFT's default over 16-bit weights) | model (default: the model's)")
	fs.StringVar(&s.optimizer, "optimizer", "", "optimizer: "+ir.Join(ir.Optimizers(), " | ")+" (adamw: PyTorch's AdamW as it runs on a GPU, foreach; -fused and -forloop: its fused=True and foreach=False; 8-bit and paged: bitsandbytes') (default: the model's)")
	fs.BoolVar(&s.padded, "padded", false, "batches carry an attention mask that pads shorter sequences (a collator pads each batch to its longest): transformers hands every sdpa layer the model's mask, which from 4.53 each layer keeps a copy of in its dtype")
	fs.Int64Var(&s.gradAccum, "grad-accum", 0, "micro-batches a step accumulates gradients over: from 2, the gradients are held through every micro-batch (default: the model's)")
	fs.StringVar(&s.masterWeights, "master-weights", "", "what the optimizer keeps of 16-bit trained weights: fp32 (an fp32 master copy and fp32 moments: DeepSpeed, Megatron-LM) | none (moments in the weights' dtype, no copy: PyTorch's AdamW and SGD over 16-bit parameters) (default: the model's; fp32)")
	fs.Int64Var(&s.buffersBytes, "buffers-bytes", 0, "bytes of the model's registered buffers (rotary inverse frequencies and cached tables, causal masks), as the live model holds them: the Python package measures them (default: the model's; modeled from the config)")
	fs.StringVar(&s.quant, "quant", "", "the decoder layers' frozen linear weights stored in nf4 | fp4 | int8 (bitsandbytes, under LoRA: QLoRA) | none (default: the model's)")
	fs.BoolVar(&s.doubleQuant, "double-quant", false, "quantize the 4-bit weights' block maxima again (QLoRA's double quantization)")
	fs.Int64Var(&s.tp, "tp", 0, "tensor parallel degree (default: the model's)")
	fs.BoolVar(&s.sp, "sp", false, "sequence parallelism (needs --tp > 1)")
	fs.Int64Var(&s.dp, "dp", 0, "data parallel degree (default: the model's)")
	fs.Int64Var(&s.zero, "zero", -1, "ZeRO stage 0-3 (default: the model's)")
	fs.StringVar(&s.sharding, "sharding", "", "the engine that runs ZeRO, whose buffers and optimizer step are counted: deepspeed (as --to deepspeed configures it) | fsdp2 (fully_shard: stage 3) (default: the model's; deepspeed for stages 1 and 2, fsdp2 for 3)")
	fs.StringVar(&s.reshard, "reshard", "", "the decoder layers FSDP2 reshards after their forward (fully_shard's reshard_after_forward): all | all-but-last (the last layer's weights stay gathered to its backward, as torchtitan 0.1's default policy does) (default: the model's; all)")
	fs.BoolVar(&s.noSync, "no-sync", false, "gradients reduced once a step, after its last microbatch (DDP's no_sync, FSDP2's set_requires_gradient_sync(False)): held whole under ZeRO 2 and 3")
}

// applyTrainingTo applies the training flags that were given to a model
// and validates it. A graph or a chain has no training setup to change:
// a training flag given for one is a usage error, not ignored.
func (s *setupFlags) applyTrainingTo(fs *flag.FlagSet, src *graphio.Source, arg string) error {
	if src.Kind == graphio.KindModel {
		s.applyTraining(fs, &src.Model.Training)
		if s.set["lora-targets"] {
			t, err := graphio.LoRATargetsNamed(src.Model, strings.Split(s.loraTargets, ","))
			if err != nil {
				return usagef("--lora-targets: %v", err)
			}
			src.Model.Training.LoRA.Targets = t
		}
		if err := src.Model.Validate(); err != nil {
			return fmt.Errorf("%s: %w", arg, err)
		}
		return nil
	}
	var given []string
	fs.Visit(func(f *flag.Flag) {
		switch {
		case src.Kind == graphio.KindGraph && f.Name == "optimizer":
			// What runs after the ops, not one of them.
			src.Graph.Optimizer = ir.Optimizer(s.optimizer)
		case src.Kind == graphio.KindGraph && f.Name == "grad-accum":
			src.Graph.GradAccum = s.gradAccum
		case s.training[f.Name]:
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) == 0 {
		return nil
	}
	what := "an explicit graph: its ops and setup are as written"
	switch {
	case src.Kind == graphio.KindChain:
		what = "a profiled chain: its costs are given"
	case src.Graph.Traced != nil:
		what = "a traced graph: its ops are what the model ran; trace it again set up that way"
	}
	return usagef("%s is %s; training flags (%s) apply to models and config.json files only", arg, what, strings.Join(given, ", "))
}

// applyTraining copies the training flags that were given into t. The
// release's rules come first: a numerics flag given with it overrides
// them.
func (s *setupFlags) applyTraining(fs *flag.FlagSet, t *ir.Setup) {
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "transformers" {
			graphio.ApplyRelease(t, s.transformers)
		}
	})
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "profile":
			t.Profile = ir.Profile(s.profile)
		case "attention":
			t.Attention = ir.AttentionKernel(s.attention)
		case "autocast":
			t.Autocast = s.autocast
			if s.autocast == "none" {
				t.Autocast = ""
			} else {
				t.DType = "fp32" // the weights autocast computes over
			}
		case "dropout":
			t.Dropout = s.dropout
		case "logits-dtype":
			t.Numerics.LogitsFP32 = s.logits == "fp32"
			t.Numerics.GPT2LossModelDType = false // what the flag says, whatever the release does
		case "dropout-mask":
			t.Numerics.ByteMasks = s.dropoutMask == "byte"
		case "rope-tables":
			t.Numerics.RopeInLayer = s.ropeTables == "layer"
			t.Numerics.RopeCached = s.ropeTables == "cached"
		case "sdpa-layout":
			t.Numerics.SDPAContiguous = s.sdpaLayout == "contiguous"
			if s.sdpaLayout == "legacy" {
				t.Numerics.SDPAGQA, t.Numerics.ModelMasks = false, false
			}
		case "kernels":
			t.Numerics.CPUKernels = s.kernels == "cpu"
		case "gqa-kernel":
			t.Numerics.SDPAGQAMath = s.gqaKernel == "math"
		case "lora-dropout":
			t.LoRA.Dropout = s.loraDropout
		case "lora-alpha":
			t.LoRA.Alpha = s.loraAlpha
		case "lora-dtype":
			t.LoRA.FP32 = s.loraDType == "fp32"
		case "lora-rank":
			t.LoRA.Rank = s.loraRank
		case "optimizer":
			t.Optimizer = ir.Optimizer(s.optimizer)
		case "grad-accum":
			t.GradAccum = s.gradAccum
		case "padded":
			t.Padded = s.padded
		case "buffers-bytes":
			t.BuffersBytes = s.buffersBytes
		case "master-weights":
			t.MasterWeights = ir.MasterWeights(s.masterWeights)
		case "quant":
			t.Quant = ir.Quant(s.quant)
			if s.quant == "none" {
				t.Quant, t.DoubleQuant = "", false
			}
		case "double-quant":
			t.DoubleQuant = s.doubleQuant
		case "tp":
			t.Parallel.TP = s.tp
		case "sp":
			t.Parallel.SP = s.sp
		case "dp":
			t.Parallel.DP = s.dp
		case "zero":
			t.Parallel.Zero = s.zero
		case "no-sync":
			t.Parallel.NoSync = s.noSync
		case "sharding":
			t.Parallel.Sharding = ir.Sharding(s.sharding)
		case "reshard":
			t.Parallel.Reshard = ir.Reshard(s.reshard)
			if t.Parallel.Reshard == ir.ReshardAll {
				t.Parallel.Reshard = "" // the default, written one way
			}
		}
	})
}

// check refuses flag values outside their vocabularies or ranges, the
// first in the order listed here, and writes --dtype's short name
// ("float32" is fp32).
func (s *setupFlags) check() error {
	// transformers' names for its attention implementations
	// (attn_implementation) where they differ from ckptplan's.
	if a, ok := map[string]string{"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa_math": "sdpa-math"}[s.attention]; ok {
		s.attention = a
	}
	for _, err := range []error{
		usageIf(s.batch < 0 || s.seq < 0 || s.set["batch"] && s.batch == 0 || s.set["seq"] && s.seq == 0, "--batch and --seq must be positive"),
		choice("profile", s.profile, ir.Profiles()...),
		choice("attention", s.attention, ir.Attentions()...),
		choice("rope-tables", s.ropeTables, "model", "layer", "cached"),
		choice("sdpa-layout", s.sdpaLayout, "views", "contiguous", "legacy"),
		choice("kernels", s.kernels, "cuda", "cpu"),
		choice("gqa-kernel", s.gqaKernel, "fused", "math"),
		choice("autocast", s.autocast, "bf16", "fp16", "none"),
		usageIf(s.gradAccum < 0, "--grad-accum: must not be negative, got %d", s.gradAccum),
		choice("master-weights", s.masterWeights, ir.MasterWeightsValues()...),
		usageIf(s.buffersBytes < 0, "--buffers-bytes: must not be negative, got %d", s.buffersBytes),
		choice("optimizer", s.optimizer, ir.Optimizers()...),
		choice("quant", s.quant, append(ir.Quants(), "none")...),
		usageIf(s.quant == "none" && s.doubleQuant, "--double-quant quantizes 4-bit weights' constants: it needs --quant nf4 or fp4, not none"),
		choice("lora-dtype", s.loraDType, "fp32", "model"),
		choice("dropout-mask", s.dropoutMask, "byte", "dtype"),
		choice("logits-dtype", s.logits, "fp32", "model"),
	} {
		if err != nil {
			return err
		}
	}
	if s.dtype != "" {
		d, err := ir.ParseDType(s.dtype)
		if err != nil || !(d == ir.FP32 || d == ir.BF16 || d == ir.FP16) {
			return usagef("--dtype: unknown value %q (valid: fp32, bf16, fp16)", s.dtype)
		}
		s.dtype = d.String()
	}
	return nil
}

// choice refuses the value v of flag name unless it is one of valid or
// "" (not given).
func choice[T ~string](name, v string, valid ...T) error {
	if v == "" {
		return nil
	}
	var x T
	if err := ir.SetOneOf(&x, v, valid); err != nil {
		return usagef("--%s: %v", name, err)
	}
	return nil
}

// usageIf returns the usage error format and args make if bad, else nil.
func usageIf(bad bool, format string, args ...any) error {
	if bad {
		return usagef(format, args...)
	}
	return nil
}

// parse parses the command line (one MODEL) and loads the model with the
// overrides; it returns the argument too.
func (s *setupFlags) parse(fs *flag.FlagSet, args []string) (*graphio.Source, string, error) {
	arg, err := oneArg(fs, args, "MODEL")
	if err != nil {
		return nil, "", err
	}
	src, err := s.load(fs, arg)
	return src, arg, err
}

// load reads MODEL and applies the overrides of the flags fs was given.
func (s *setupFlags) load(fs *flag.FlagSet, arg string) (*graphio.Source, error) {
	s.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { s.set[f.Name] = true })
	if err := s.check(); err != nil {
		return nil, err
	}
	src, err := graphio.Load(arg)
	if err != nil {
		return nil, err
	}
	switch src.Kind {
	case graphio.KindModel:
		t := &src.Model.Training
		if s.batch > 0 {
			t.Batch = s.batch
		}
		if s.seq > 0 {
			t.Seq = s.seq
		}
		if s.dtype != "" {
			t.DType = s.dtype
		}
		if err := src.Model.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", arg, err)
		}
	case graphio.KindGraph:
		if t := src.Graph.Traced; t != nil && (s.batch != 0 || s.seq != 0 || s.dtype != "") {
			return nil, usagef("%s was traced for batch %d, seq %d in %v: --batch, --seq and --dtype do not apply; trace it again with those (ckptplan trace --batch N --seq N --dtype D)", arg, t.Batch, t.Seq, src.Graph.DType)
		}
		for _, o := range []struct {
			dim, flag string
			v         int64
		}{{"b", "batch", s.batch}, {"s", "seq", s.seq}} {
			if o.v == 0 {
				continue
			}
			if _, ok := src.Graph.Dims[o.dim]; !ok {
				return nil, fmt.Errorf("%s: the graph has no dim %q for --%s to set", arg, o.dim, o.flag)
			}
			src.Graph.Dims[o.dim] = o.v
		}
		if s.dtype != "" {
			src.Graph.DType, _ = ir.ParseDType(s.dtype)
		}
	case graphio.KindChain:
		if s.batch != 0 || s.seq != 0 || s.dtype != "" {
			return nil, usagef("%s is a profiled chain: --batch, --seq and --dtype do not apply", arg)
		}
	}
	return src, nil
}

// buildGraph expands a model or graph source into its graph.
func buildGraph(src *graphio.Source) (*ir.Graph, error) {
	switch src.Kind {
	case graphio.KindModel:
		return graphio.Build(src.Model)
	case graphio.KindGraph:
		return src.Graph.Build()
	}
	return nil, fmt.Errorf("%s is a profiled chain, not a graph", src.Name)
}
