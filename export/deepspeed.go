package export

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/planner"
)

// DeepSpeed's configuration does not choose layers: a layer is
// checkpointed where the model passes it to deepspeed.checkpointing's
// checkpoint — every decoder layer under transformers'
// gradient_checkpointing_enable(), groups of N layers from each group's
// input under DeepSpeed's PipelineModule(activation_checkpoint_interval=N),
// any layers a model's own forward wraps — and the config's
// activation_checkpointing section says how: whether the kept inputs are
// split over tensor-parallel ranks (partition_activations), moved to the
// host (cpu_checkpointing) or copied into one buffer
// (contiguous_memory_optimization, sized by number_checkpoints).
// ckptplan's plans keep each checkpointed input whole on the GPU, so all
// three are off. The export writes that section with the micro batch, the
// 16-bit dtype and the ZeRO stage the plan was made for, and says beside
// it which layers to checkpoint. A plan runs as planned when each layer is
// stored or checkpointed from its own input, or the layers form groups;
// a layer kept in part (a keep set) or kept from an earlier checkpoint
// does not, and the closest plan is then the cheapest that fits of
// checkpointing no layer or the first k (Megatron's block method).

// deepSpeedAC is the layers DeepSpeed checkpoints: groups of every
// layers when every > 1, else those layers says, each from its input.
type deepSpeedAC struct {
	layers []bool
	every  int
}

// checkpointed returns the checkpointed layers' indexes.
func (a deepSpeedAC) checkpointed() []int {
	var out []int
	for i, c := range a.layers {
		if c {
			out = append(out, i)
		}
	}
	return out
}

// groups is the number of checkpoints a step makes.
func (a deepSpeedAC) groups() int {
	if a.every > 1 {
		return (len(a.layers) + a.every - 1) / a.every
	}
	return len(a.checkpointed())
}

// how says how a trainer runs the setting.
func (a deepSpeedAC) how() string {
	ck := a.checkpointed()
	switch {
	case a.every > 1:
		return fmt.Sprintf("checkpoint the decoder layers in groups of %d, each from its first layer's input, with deepspeed.checkpointing.checkpoint: PipelineModule(..., activation_checkpoint_interval=%d) over the decoder layers", a.every, a.every)
	case len(ck) == 0:
		return "checkpoint no layer: leave gradient checkpointing off"
	case len(ck) == len(a.layers):
		return "checkpoint every decoder layer, each from its input, with deepspeed.checkpointing.checkpoint: transformers' model.gradient_checkpointing_enable(), or PipelineModule(..., activation_checkpoint_interval=1)"
	}
	return fmt.Sprintf("checkpoint %s (%d of %d decoder layers), each from its input, with deepspeed.checkpointing.checkpoint in the model's forward; store the others", spans(ck, "layers."), len(ck), len(a.layers))
}

// DeepSpeedSettings are the settings the closest plan is chosen from
// (planner.CheapestLayers) when the plan is not one DeepSpeed runs: no
// layer checkpointed, or the first k of n, each from its input.
func DeepSpeedSettings(n int) []planner.LayerSetting {
	return planner.FirstLayers("deepspeed none", "deepspeed first %d", n)
}

// deepSpeedExact returns the layers DeepSpeed checkpoints to run the plan
// as planned: each layer stored or checkpointed from its input, or groups.
func (e *Export) deepSpeedExact() (deepSpeedAC, bool) {
	a := deepSpeedAC{layers: make([]bool, len(e.Layers))}
	if g := e.uniform(); g > 0 {
		a.every = g
		for i := range a.layers {
			a.layers[i] = true
		}
		return a, true
	}
	for i, l := range e.Layers {
		switch {
		case l.Mode == ModeCheckpoint && !e.nothing[i]:
			a.layers[i] = true
		case l.Mode != ModeStore:
			return deepSpeedAC{}, false
		}
	}
	return a, true
}

// DeepSpeedExact reports whether DeepSpeed runs the plan's layers as
// planned.
func (e *Export) DeepSpeedExact() bool {
	_, ok := e.deepSpeedExact()
	return ok
}

// deepSpeedConfig is the part of a DeepSpeed config the export writes.
type deepSpeedConfig struct {
	MicroBatch int64           `json:"train_micro_batch_size_per_gpu,omitempty"`
	BF16       *enabled        `json:"bf16,omitempty"`
	FP16       *enabled        `json:"fp16,omitempty"`
	ZeRO       *zeroStage      `json:"zero_optimization,omitempty"`
	AC         deepSpeedACJSON `json:"activation_checkpointing"`
}

type enabled struct {
	Enabled bool `json:"enabled"`
}

// zeroStage is the zero_optimization section. It sets the buckets
// (deepSpeedZeRO12, deepSpeedZeRO3) instead of leaving DeepSpeed's
// defaults.
type zeroStage struct {
	Stage                int64  `json:"stage"`
	ContiguousGradients  *bool  `json:"contiguous_gradients,omitempty"`
	OverlapComm          *bool  `json:"overlap_comm,omitempty"`
	ReduceBucket         *int64 `json:"reduce_bucket_size,omitempty"`
	PrefetchBucket       *int64 `json:"stage3_prefetch_bucket_size,omitempty"`
	MaxLiveParameters    *int64 `json:"stage3_max_live_parameters,omitempty"`
	MaxReuseDistance     *int64 `json:"stage3_max_reuse_distance,omitempty"`
	PersistenceThreshold *int64 `json:"stage3_param_persistence_threshold,omitempty"`
}

// DeepSpeed's ZeRO stage 3 gathers parameters module by module, as its
// forward and backward hooks reach them, in the order it traced in the
// first step, and prefetches those the trace says come next. Its defaults
// hold far more than ckptplan counts gathered (costmodel.DeepSpeedGathers
// replays the coordinator under the settings below): a parameter whose next use is fewer than stage3_max_reuse_distance (10⁹)
// parameters away is not released, which on a model of under 10⁹
// parameters keeps every parameter gathered from the second step on;
// parameters of at most stage3_param_persistence_threshold (10⁵) elements
// are never sharded; and the gradients are reduced through one buffer of
// reduce_bucket_size (5·10⁸) elements, allocated whole (1 GB in 16 bits)
// whatever the model. The export therefore sets them: a module's
// parameters are released once it has run (reuse distance 0) and none
// persist; at most the largest layer's parameters are gathered ahead (the
// prefetch bucket and the live limit, which bounds what the prefetch adds
// to what is gathered); the gradient buffer holds the largest layer's
// trainable parameters. What DeepSpeed then gathers is measured, on the
// CPU in a two-rank gloo group (python/tests/test_deepspeed_zero3.py), as
// the plan counts it, block by block; with the defaults it is far more.

// DeepSpeed's ZeRO stages 1 and 2 reduce the gradients through a buffer
// of reduce_bucket_size (5·10⁸) elements allocated whole when the
// backward starts, two with overlap_comm, whatever the model: 1 GB in 16
// bits, which the plan's reduce buffers (costmodel's zeroReduceSet: a
// layer's gradients a bucket) do not hold. The export sets the bucket to
// the largest layer's trainable parameters, one at a time (overlap_comm
// off), the gradients copied into it as they come (contiguous_gradients).
// All-gathering the updated weights after the step writes into the
// weights in place, whatever allgather_bucket_size says: it is left
// alone. What DeepSpeed then holds is measured on the CPU in a two-rank
// gloo group (python/tests/test_deepspeed_zero12.py).

// deepSpeedZeRO returns the zero_optimization section of the plan's
// stage, nil without ZeRO.
func (e *Export) deepSpeedZeRO() *zeroStage {
	switch {
	case e.Zero >= 3:
		return deepSpeedZeRO3(e.zeroLayer.params, e.zeroLayer.trainable)
	case e.Zero > 0:
		return deepSpeedZeRO12(e.Zero, e.zeroLayer.trainable)
	}
	return nil
}

// deepSpeedZeRO12 returns the stage 1 or 2 section for layers of at most
// trainable trained parameters.
func deepSpeedZeRO12(stage, trainable int64) *zeroStage {
	yes, no := true, false
	bucket := max(trainable, 1)
	return &zeroStage{Stage: stage, ContiguousGradients: &yes, OverlapComm: &no, ReduceBucket: &bucket}
}

// deepSpeedZeRO3 returns the stage 3 section for layers of at most params
// parameters, trainable of them trained.
func deepSpeedZeRO3(params, trainable int64) *zeroStage {
	var zero int64
	live := max(params, 1)
	bucket := max(trainable, 1)
	return &zeroStage{Stage: 3, ReduceBucket: &bucket, PrefetchBucket: &live, MaxLiveParameters: &live,
		MaxReuseDistance: &zero, PersistenceThreshold: &zero}
}

type deepSpeedACJSON struct {
	PartitionActivations bool `json:"partition_activations"`
	CPUCheckpointing     bool `json:"cpu_checkpointing"`
	ContiguousMemory     bool `json:"contiguous_memory_optimization"`
	// NumberCheckpoints: the checkpointed groups of a step, which only
	// contiguous_memory_optimization reads; null when none.
	NumberCheckpoints   *int `json:"number_checkpoints"`
	SynchronizeBoundary bool `json:"synchronize_checkpoint_boundary"`
	Profile             bool `json:"profile"`
}

// The DeepSpeed target: its config, which runs ZeRO as DeepSpeed does.
var deepSpeedTarget = &Target{Name: "deepspeed", Help: "its JSON config; the layers to checkpoint on stderr", Sharder: ir.ShardingDeepSpeed,
	Closest: closestLayers((*Export).DeepSpeedExact, DeepSpeedSettings, "DeepSpeed", "no layer checkpointed, or the first 1 to %d"),
	Write: func(w io.Writer, e *Export, s *Setting, _ string) ([]string, error) {
		runs, at := s.closestPlan()
		return e.DeepSpeed(w, runs, at)
	}}

// DeepSpeed writes the DeepSpeed config (JSON) the plan was made for and
// returns what a trainer must do beside it — the layers to checkpoint, and
// the peak and compute that run — for the caller to show: JSON has no
// comments. The setting is the plan's own when it is one of DeepSpeed's,
// else DeepSpeedSettings' setting at, whose plan (the cheapest that fits)
// is runs, compared with the plan. Without either it says why not and
// returns an error.
func (e *Export) DeepSpeed(w io.Writer, runs *planner.Plan, at int) ([]string, error) {
	if e.Zero >= 1 && !e.zeroLayer.known {
		return nil, fmt.Errorf("the plan for %s is for ZeRO stage %d, whose DeepSpeed buckets the export sets from the layers' sizes, which a saved plan does not record: export from the model", comment(e.Model), e.Zero)
	}
	a, exact := e.deepSpeedExact()
	var notes []string
	if exact {
		notes = append(notes, fmt.Sprintf("DeepSpeed: %s; every layer runs as planned: peak %v, %+.1f%% compute", a.how(), e.PeakBytes, 100*e.Overhead))
		for _, n := range e.Notes {
			if !(a.every > 1 && (n == e.nothingNote || n == e.runtimeNote)) {
				notes = append(notes, n)
			}
		}
	} else {
		if runs == nil {
			return nil, fmt.Errorf("the plan for %s cannot be run by DeepSpeed's activation checkpointing: %s; export from the model (not a saved plan) for the closest setting, or plan with --solver every-k", comment(e.Model), comment(e.layerSummary()))
		}
		settings := DeepSpeedSettings(len(e.Layers))
		if at < 0 || at >= len(settings) {
			return nil, fmt.Errorf("DeepSpeed has no setting %d", at)
		}
		a = deepSpeedAC{layers: make([]bool, len(e.Layers))}
		for i := range a.layers {
			a.layers[i] = settings[at].Checkpoint(i, len(a.layers))
		}
		notes = append(notes,
			fmt.Sprintf("the plan (%s solver: peak %v, %+.1f%% compute) has %s, which DeepSpeed's settings cannot say", e.Solver, e.PeakBytes, 100*e.underSAC().Overhead, e.layerSummary()),
			fmt.Sprintf("DeepSpeed: the closest setting, and the cheapest that fits: %s: peak %v, %+.1f%% compute", a.how(), runs.PeakBytes, 100*runs.Overhead))
	}
	c := deepSpeedConfig{MicroBatch: e.Batch}
	switch e.DType {
	case "bf16":
		c.BF16 = &enabled{true}
	case "fp16":
		c.FP16 = &enabled{true}
	}
	c.ZeRO = e.deepSpeedZeRO()
	switch {
	case e.Zero >= 3:
		notes = append(notes, fmt.Sprintf("ZeRO 3: the config sets DeepSpeed's buckets to gather no more than the plan counts: at most the largest layer's %d parameters prefetched, each module's released once it has run, none left unsharded, %d gradients reduced at a time; DeepSpeed's defaults keep up to 10^9 parameters gathered and a bucket of 5*10^8 gradients",
			*c.ZeRO.PrefetchBucket, *c.ZeRO.ReduceBucket))
	case e.Zero > 0:
		notes = append(notes, fmt.Sprintf("ZeRO %d: the config sets DeepSpeed's gradient bucket to the largest layer's %d gradients, one bucket at a time, as the plan counts; DeepSpeed's default bucket is 5*10^8 gradients (1 GB in 16 bits), two with overlap_comm",
			e.Zero, *c.ZeRO.ReduceBucket))
	}
	if n := a.groups(); n > 0 {
		c.AC.NumberCheckpoints = &n
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	_, err = w.Write(append(data, '\n'))
	return notes, err
}
