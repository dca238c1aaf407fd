package export

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
)

// Layer is one transformer layer of an exported plan.
type Layer struct {
	Name   string `json:"name"`
	Mode   Mode   `json:"mode"`             // store, checkpoint or selective
	Policy string `json:"policy,omitempty"` // selective: the keep set
	// Keeps says a selective layer's keep set in words: what it keeps, or
	// what its backward recomputes (planner.KeepSet.Words).
	Keeps string `json:"keeps,omitempty"`
	// Saved lists, for a selective layer, the activation storages the
	// layer saves in the order autograd first packs them, and which stay.
	Saved []planner.SavedTensor `json:"saved,omitempty"`
	// KeptBytes is what the layer holds after the forward, its output
	// included and its input not (the layer before holds it).
	KeptBytes mem.Bytes `json:"kept_bytes"`
	// HostBytes is what the layer keeps in host memory, apart from
	// KeptBytes and from the device's budget (planner.Stage.HostBytes).
	HostBytes mem.Bytes `json:"host_bytes,omitempty"`
	// RecomputeFLOPs is the forward work the runtime reruns in the layer's
	// backward: a checkpoint's replay up to its early stop, selective
	// checkpointing's uncached ops, or (PyTorch before 2.4) the whole
	// forward of a selective layer.
	RecomputeFLOPs float64 `json:"recompute_flops"`
}

// Export is a plan reduced to per-layer decisions.
type Export struct {
	Schema      int       `json:"schema"`
	Model       string    `json:"model"`
	Solver      string    `json:"solver"`
	BudgetBytes mem.Bytes `json:"budget_bytes"`
	// ReserveBytes is the part of the budget left for what is not a
	// tensor (CUDA context, workspaces, allocator slack).
	ReserveBytes mem.Bytes `json:"reserve_bytes"`
	StaticBytes  mem.Bytes `json:"static_bytes"` // held the whole step (weights, optimizer state; gradients unless the backward makes them): part of the peak
	PeakBytes    mem.Bytes `json:"peak_bytes"`
	// PeakAt says when the step holds PeakBytes ("backward of layers.3",
	// "optimizer step").
	PeakAt string `json:"peak_at,omitempty"`
	// StepPeakBytes is what the optimizer step holds.
	StepPeakBytes mem.Bytes `json:"step_peak_bytes,omitempty"`
	// RuntimePeakBytes is the peak run layer by layer (each layer stored,
	// kept in part or checkpointed once; other stages stored), as trainers
	// and ckptplan.apply run it, when known.
	RuntimePeakBytes mem.Bytes `json:"runtime_peak_bytes,omitempty"`
	Overhead         float64   `json:"overhead"`
	// HostBytes is what the step keeps in host memory, every stage's
	// (the layers', and the embedding's and head's: the Python numbers
	// their products keep), apart from PeakBytes and the budget.
	HostBytes mem.Bytes `json:"host_bytes,omitempty"`
	// Runtime is what the plan was made for (planner.Runtime): per-layer
	// for every runtime an export writes for, unless asked otherwise.
	Runtime planner.Runtime `json:"runtime,omitempty"`
	// RecomputeFLOPs is the layers' RecomputeFLOPs summed; Overhead is it
	// over the step's work without recomputation.
	RecomputeFLOPs float64            `json:"recompute_flops"`
	Batch          int64              `json:"batch,omitempty"`
	Seq            int64              `json:"seq,omitempty"`
	DType          string             `json:"dtype,omitempty"`
	Autocast       string             `json:"autocast,omitempty"`
	Attention      ir.AttentionKernel `json:"attention,omitempty"`
	Profile        ir.Profile         `json:"profile,omitempty"`
	// Zero is the ZeRO stage the plan's static memory assumes (0: none).
	Zero int64 `json:"zero,omitempty"`
	// DeepSpeedZeRO is the zero_optimization section the plan holds
	// for where DeepSpeed runs its ZeRO (the DeepSpeed export's: its
	// buckets set from the largest layer); absent otherwise.
	DeepSpeedZeRO *zeroStage `json:"deepspeed_zero,omitempty"`
	Layers        []Layer    `json:"layers"`
	Notes         []string   `json:"notes,omitempty"`

	nothing     []bool    // per layer: the plan keeps not even its input
	nothingNote string    // the note saying so, which Megatron's uniform method makes moot
	runtimeNote string    // the note on the layer-by-layer peak, which Megatron's uniform method, running the groups as planned, does not reach
	wholeRerun  []float64 // per layer: what checkpointing it whole reruns
	sacRerun    []float64 // per layer: what it reruns under selective activation checkpointing
	baseline    float64   // the step's work without recomputation
	nested      bool      // the plan recomputes a layer more than once
	// zeroLayer are the sizes ZeRO's buckets are set from (the largest
	// layer's parameters and trainable parameters); zero when the plan
	// was read back from JSON, which does not record them.
	zeroLayer struct {
		known             bool
		params, trainable int64
	}
}

func isLayer(name string) bool {
	_, ok := ir.LayerIndex(name)
	return ok
}

// FromPlan reduces a feasible plan of a model to its layers' decisions.
func FromPlan(plan *planner.Plan) (*Export, error) {
	if !plan.Feasible {
		return nil, fmt.Errorf("the plan for %s does not fit its budget: nothing to export", comment(plan.Model))
	}
	e := &Export{Schema: 1, Model: plan.Model, Solver: plan.Solver, BudgetBytes: plan.BudgetBytes, ReserveBytes: plan.ReserveBytes, StaticBytes: plan.StaticBytes, PeakBytes: plan.PeakBytes, StepPeakBytes: plan.StepPeakBytes, Overhead: plan.Overhead, Runtime: plan.Runtime}
	if plan.Peak != nil {
		e.PeakAt = plan.Peak.At
	}
	if plan.PagedOutBytes > 0 {
		e.Notes = append(e.Notes, fmt.Sprintf("the GPU holds the plan's peak with %v of the paged optimizer's state on the host, which the driver moves there and back each step", plan.PagedOutBytes))
	}
	if s := plan.Setup; s != nil {
		e.Batch, e.Seq, e.DType, e.Attention, e.Profile, e.Autocast = s.Batch, s.Seq, s.DType, s.Attention, s.Profile, s.Autocast
		e.Zero = s.Parallel.Zero
	}
	if st := plan.Static; st != nil && e.Zero >= 1 {
		e.zeroLayer.known, e.zeroLayer.params, e.zeroLayer.trainable = true, st.LayerParams, st.LayerTrainable
		if s := plan.Setup; s != nil && s.Parallel.Sharder() == ir.ShardingDeepSpeed && s.Profile != ir.ProfileMegatron {
			e.DeepSpeedZeRO = e.deepSpeedZeRO()
		}
	}
	forwards := make([]int, len(plan.Stages))
	recomputedWith := map[int]string{}
	seen := make([]bool, len(plan.Stages))
	for _, s := range plan.Schedule {
		if s.Stage < 0 || s.Stage >= len(plan.Stages) || s.Op == "B" || s.Op == "loss" {
			continue
		}
		forwards[s.Stage]++
		if seen[s.Stage] && s.Option != "" {
			recomputedWith[s.Stage] = s.Option
		}
		seen[s.Stage] = true
	}
	var nested, keptNothing []string
	var nothingBytes mem.Bytes
	for i, st := range plan.Stages {
		e.HostBytes += st.HostBytes
		n, layer := ir.LayerIndex(st.Name)
		if !layer {
			switch st.Decision {
			case planner.DecisionSelective:
				if o := st.KeepSet(); o != nil {
					e.Notes = append(e.Notes, fmt.Sprintf("the plan keeps part of %s (%s); trainers run it plainly, which keeps %v more", st.Name, st.Option, mem.Bytes(st.SavedBytes-o.SavedBytes)))
				}
			case planner.DecisionCheckpoint, planner.DecisionRecompute:
				e.Notes = append(e.Notes, fmt.Sprintf("the plan does not store %s (%s); trainers run it plainly, which keeps up to %v more", st.Name, st.Decision, mem.Bytes(st.SavedBytes)))
			}
			continue
		}
		if n != len(e.Layers) {
			return nil, fmt.Errorf("the plan's layers are not layers.0, layers.1, … in order: %s is stage %d", comment(st.Name), i)
		}
		out := st.SavedBytes
		if i+1 < len(plan.Stages) {
			out = plan.Stages[i+1].InputBytes
		}
		// The layer's output stays after the forward when something
		// saves it: its own ops or the next stage's, or the next layer's
		// checkpoint, which keeps its input. A stage that is not a layer
		// runs plainly, storing.
		outFreed := st.OutputUnsaved && i+1 < len(plan.Stages) &&
			(plan.Stages[i+1].Decision == planner.DecisionStore || !isLayer(plan.Stages[i+1].Name))
		l := Layer{Name: st.Name, KeptBytes: st.SavedBytes, HostBytes: st.HostBytes}
		sac := -1.0 // the layer's RecomputeFLOPs, but for a selective one
		rerun := st.Forward
		if st.Rerun > 0 {
			rerun = st.Rerun
		}
		switch st.Decision {
		case planner.DecisionStore:
			l.Mode = ModeStore
		case planner.DecisionSelective:
			l.Mode, l.Policy = ModeSelective, st.Option
			o := st.KeepSet()
			if o == nil {
				return nil, fmt.Errorf("%s: the plan does not describe its keep set %q", comment(st.Name), st.Option)
			}
			l.Saved, l.KeptBytes, l.Keeps = o.Saved, o.SavedBytes, o.Words(st.Name)
			// Selective checkpointing (the transformers profile's runtime)
			// reruns what the keep set says; the saved-tensor hooks of
			// older PyTorch rerun the whole forward.
			l.RecomputeFLOPs = st.Forward
			if plan.Setup != nil && plan.Setup.Profile == ir.ProfileTransformers {
				l.RecomputeFLOPs = o.ExtraCost
			}
			sac = o.ExtraCost
		case planner.DecisionCheckpoint, planner.DecisionRecompute:
			l.Mode, l.KeptBytes, l.RecomputeFLOPs = ModeCheckpoint, out, rerun
			if st.Decision == planner.DecisionRecompute {
				keptNothing = append(keptNothing, st.Name)
				nothingBytes += st.InputBytes
			}
		default:
			return nil, fmt.Errorf("%s: unknown decision %q", comment(st.Name), st.Decision)
		}
		if outFreed {
			l.KeptBytes -= out
		}
		e.nothing = append(e.nothing, st.Decision == planner.DecisionRecompute)
		e.wholeRerun = append(e.wholeRerun, rerun)
		if sac < 0 {
			sac = l.RecomputeFLOPs
		}
		e.sacRerun = append(e.sacRerun, sac)
		if forwards[i] > 2 {
			nested = append(nested, st.Name)
		}
		if o, ok := recomputedWith[i]; ok && st.Decision != planner.DecisionSelective && st.Decision != planner.DecisionStore {
			e.Notes = append(e.Notes, fmt.Sprintf("%s: the plan recomputes it keeping %s; a checkpoint reruns it storing everything", st.Name, o))
		}
		e.RecomputeFLOPs += l.RecomputeFLOPs
		e.Layers = append(e.Layers, l)
	}
	e.baseline = plan.BaselineCost
	if plan.BaselineCost > 0 {
		// What the runtime pays, layer by layer, which may differ from the
		// schedule's own cost (a rerun that stops early, one that reruns
		// more than the plan asked).
		e.Overhead = e.RecomputeFLOPs / plan.BaselineCost
	}
	if len(e.Layers) == 0 {
		return nil, fmt.Errorf("the plan for %s has no layers.N stages: only a model's layers can be exported", comment(plan.Model))
	}
	if len(keptNothing) > 0 {
		e.nothingNote = fmt.Sprintf("the plan keeps no input for %s (recomputed from an earlier checkpoint); a trainer checkpoints each layer, keeping its input: %v more after the forward", list(keptNothing), mem.Bytes(nothingBytes))
		e.Notes = append(e.Notes, e.nothingNote)
	}
	e.nested = len(nested) > 0
	if len(nested) > 0 {
		e.Notes = append(e.Notes, fmt.Sprintf("the plan recomputes %s more than once; a checkpoint reruns a layer once, so the backward may peak above the plan's %v", list(nested), mem.Bytes(plan.PeakBytes)))
	}
	return e, nil
}

// underSAC is the export as a runtime with selective activation
// checkpointing runs it: a selective layer reruns only the ops that make
// what its keep set drops.
func (e *Export) underSAC() *Export {
	c := *e
	c.Layers = slices.Clone(e.Layers)
	c.RecomputeFLOPs = 0
	for i := range c.Layers {
		c.Layers[i].RecomputeFLOPs = e.sacRerun[i]
		c.RecomputeFLOPs += e.sacRerun[i]
	}
	if c.baseline > 0 {
		c.Overhead = c.RecomputeFLOPs / c.baseline
	}
	return &c
}

// LayerByLayer records rt, the plan as trainers and ckptplan.apply run
// it, each layer on its own (planner.Problem.LayerRuntime): its peak, and
// a note where that exceeds the plan's. Where that takes it past the
// budget (a plan that reruns layers from an earlier checkpoint, which
// such a runtime cannot), it is a *planner.RuntimeOverBudget.
func (e *Export) LayerByLayer(rt *planner.Plan) error {
	e.RuntimePeakBytes = rt.PeakBytes
	if rt.PeakBytes <= e.PeakBytes {
		return nil
	}
	if rt.PeakBytes+e.ReserveBytes > e.BudgetBytes {
		reserve := ""
		if e.ReserveBytes > 0 {
			reserve = fmt.Sprintf(" less its %v reserve", e.ReserveBytes)
		}
		why := "its schedule reruns layers from an earlier checkpoint, which they cannot; plan with --solver selective or optimal, which plan layer by layer"
		if e.Runtime == planner.Nested {
			why = "it was planned for a runtime that reruns layers from an earlier checkpoint, which they cannot; plan without --runtime nested"
		}
		return &planner.RuntimeOverBudget{MinBudget: rt.PeakBytes + e.ReserveBytes, Msg: fmt.Sprintf(
			"%s: run layer by layer, as trainers and ckptplan.apply run it, the %s plan peaks at %v (%d bytes), more than the %v budget%s: %s, or export with a budget of at least %v",
			comment(e.Model), e.Solver, rt.PeakBytes, rt.PeakBytes, e.BudgetBytes, reserve, why, rt.PeakBytes+e.ReserveBytes)}
	}
	e.runtimeNote = fmt.Sprintf("run layer by layer, as trainers run it, the plan peaks at %v, above its own %v", rt.PeakBytes, e.PeakBytes)
	e.Notes = append(e.Notes, e.runtimeNote)
	return nil
}

// list names layers compactly: "layers.1–3, layers.7".
func list(names []string) string {
	xs := make([]int, len(names))
	for i, n := range names {
		xs[i] = index(n)
	}
	return spans(xs, "layers.")
}

func index(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "layers."))
	return n
}

// indexes returns the layer numbers of a mode.
func (e *Export) indexes(mode Mode) []int {
	var out []int
	for i, l := range e.Layers {
		if l.Mode == mode {
			out = append(out, i)
		}
	}
	return out
}

// spans writes increasing layer numbers compactly, each run after
// prefix: "0, 2–5, 7", or with "layers." "layers.0, layers.2–5".
func spans(xs []int, prefix string) string {
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%s%d–%d", prefix, xs[i], xs[j]))
		} else {
			parts = append(parts, prefix+strconv.Itoa(xs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}
