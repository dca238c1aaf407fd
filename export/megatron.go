package export

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/stage"
)

var megatronTarget = &Target{Name: "megatron", Help: "flags",
	Closest: func(e *Export, p *planner.Problem, opt *planner.Options) (*Setting, error) {
		if e.MegatronExact() {
			return nil, nil
		}
		closest, r, err := cheapestMegatron(p, opt, len(e.Layers))
		if err != nil {
			return nil, err
		}
		if closest == nil {
			return nil, fmt.Errorf("%s: no Megatron-LM recomputation setting (none, selective of any modules, or block with 1 to %d layers) fits in %v, though the %s plan does", e.Model, len(e.Layers), e.BudgetBytes, e.Solver)
		}
		return &Setting{Plan: closest, Megatron: r}, nil
	},
	Write: func(w io.Writer, e *Export, s *Setting, _ string) ([]string, error) {
		if s == nil {
			return nil, e.Megatron(w, nil, planner.MegatronRecompute{})
		}
		return nil, e.Megatron(w, s.Plan, s.Megatron)
	}}

// Megatron writes the Megatron-LM flags that run the plan, when they can:
// Megatron recomputes either the same modules of every layer
// (--recompute-granularity selective: the attention core, or the
// --recompute-modules the plan's keep sets name) or whole layers, the
// first N of each pipeline stage (--recompute-method block) or groups of
// N layers from a checkpoint at each group's input (uniform). Otherwise it writes the
// flags of r, the closest setting, whose plan (the cheapest that fits:
// cheapestMegatron) is runs, with a header comparing it with the
// plan; without runs it says why not and returns an error.
func (e *Export) Megatron(w io.Writer, runs *planner.Plan, r planner.MegatronRecompute) error {
	flags, uniform, why := e.megatronExact()
	var b strings.Builder
	fmt.Fprintf(&b, "# The activation plan of %s for Megatron-LM, made by ckptplan (one pipeline stage).\n", comment(e.Model))
	if why != "" {
		if runs == nil {
			return fmt.Errorf("the plan for %s cannot be written as Megatron-LM flags: %s", comment(e.Model), comment(why))
		}
		fmt.Fprintf(&b, "# The plan (%s solver: peak %v, %+.1f%% compute) has %s,\n", comment(e.Solver), e.PeakBytes, 100*e.underSAC().Overhead, comment(e.layerSummary()))
		b.WriteString("# which Megatron-LM's flags cannot say. The closest setting they can, and the cheapest that fits:\n")
		fmt.Fprintf(&b, "# peak %v, %+.1f%% compute.\n", runs.PeakBytes, 100*runs.Overhead)
		if f := recomputeFlags(r); f != "" {
			fmt.Fprintf(&b, "%s\n", f)
		} else {
			b.WriteString("# (no flags: Megatron-LM stores every layer by default)\n")
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	for _, note := range e.Notes {
		if !(uniform && (note == e.nothingNote || note == e.runtimeNote)) {
			fmt.Fprintf(&b, "# Note: %s.\n", comment(note))
		}
	}
	fmt.Fprintf(&b, "%s\n", flags)
	_, err := io.WriteString(w, b.String())
	return err
}

// MegatronSettings are Megatron-LM's whole-layer settings on one pipeline
// stage of n layers: none, and block k (its first k layers checkpointed,
// --recompute-method block), k from 1 to n. Setting k is
// planner.MegatronRecompute{Block: k}.
func MegatronSettings(n int) []planner.LayerSetting {
	return planner.FirstLayers("megatron none", "megatron block %d", n)
}

// cheapestMegatron returns the plan of the cheapest Megatron-LM setting
// that fits on one pipeline stage of n layers, and the setting: none or
// block k (MegatronSettings, planned as Megatron runs them), or selective
// of a set of modules (the megatron-selective strategy, where the layers
// have them; planner.MegatronSelectiveSettings). Of equal costs the first
// wins. The plan is nil when none fits.
func cheapestMegatron(p *planner.Problem, o *planner.Options, n int) (*planner.Plan, planner.MegatronRecompute, error) {
	best, at, err := p.CheapestLayers(o, MegatronSettings(n))
	if err != nil {
		return nil, planner.MegatronRecompute{}, err
	}
	r := planner.MegatronRecompute{Block: max(at, 0)}
	for _, s := range planner.MegatronSelectiveSettings() {
		sel := *o
		sel.Strategy, sel.Modules = planner.MegatronSelective, s.Modules
		if plan, err := p.Plan(&sel); err == nil && plan.Feasible && (best == nil || plan.Cost < best.Cost) {
			best, r = plan, s
		}
	}
	return best, r, nil
}

// megatronExact returns the flags that run the plan as planned, and
// whether they are the uniform method's; else why none do.
func (e *Export) megatronExact() (flags string, uniform bool, why string) {
	modes := make([]string, len(e.Layers))
	for i, l := range e.Layers {
		modes[i] = l.Mode.String()
		if l.Mode == ModeSelective {
			modes[i] += ":" + l.Policy
		}
	}
	switch {
	case all(modes, ModeStore.String()):
		return "# (no flags: the plan stores every layer, Megatron-LM's default)", false, ""
	case selectiveModules(modes) != 0:
		return recomputeFlags(planner.MegatronRecompute{Modules: selectiveModules(modes)}), false, ""
	case e.block(modes) > 0:
		return recomputeFlags(planner.MegatronRecompute{Block: e.block(modes)}), false, ""
	case e.uniform() > 0:
		return fmt.Sprintf("--recompute-granularity full --recompute-method uniform --recompute-num-layers %d", e.uniform()), true, ""
	}
	return "", false, e.whyNot(modes)
}

// MegatronExact reports whether Megatron-LM's flags run the plan's layers
// as planned.
func (e *Export) MegatronExact() bool {
	_, _, why := e.megatronExact()
	return why == ""
}

// selectiveModules returns the modules when every layer runs the keep
// set of Megatron-LM's selective recomputation of the same modules, else
// 0.
func selectiveModules(modes []string) costmodel.Module {
	if len(modes) == 0 {
		return 0
	}
	policy, ok := strings.CutPrefix(modes[0], "selective:")
	if !ok || !all(modes, modes[0]) {
		return 0
	}
	m, _ := stage.MegatronPolicyModules(policy)
	return m
}

func all(modes []string, m string) bool {
	for _, x := range modes {
		if x != m {
			return false
		}
	}
	return true
}

// block returns N when the first N layers are checkpointed (each keeping
// its own input) and the rest stored, else 0.
func (e *Export) block(modes []string) int {
	k := 0
	for k < len(modes) && modes[k] == ModeCheckpoint.String() && !e.nothing[k] {
		k++
	}
	if k == 0 || !all(modes[k:], ModeStore.String()) {
		return 0
	}
	return k
}

// uniform returns N > 1 when the layers form groups of N (the last one
// possibly shorter), each keeping only its first layer's input, else 0.
func (e *Export) uniform() int {
	n := len(e.Layers)
	size := n // the first layer after 0 that keeps its input starts group 2
	for i := 1; i < n; i++ {
		if !e.nothing[i] {
			size = i
			break
		}
	}
	for i, l := range e.Layers {
		if l.Mode != ModeCheckpoint || e.nothing[i] != (i%size != 0) {
			return 0
		}
	}
	if size < 2 {
		return 0
	}
	return size
}

func (e *Export) whyNot(modes []string) string {
	counts := map[string][]int{}
	var order []string
	for i, m := range modes {
		if _, ok := counts[m]; !ok {
			order = append(order, m)
		}
		counts[m] = append(counts[m], i)
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s %s", m, ints(counts[m])))
	}
	return fmt.Sprintf("Megatron applies one granularity to every layer (selective: the same modules of all, of core_attn, layernorm and mlp; full: the first N layers, or groups of N), and the plan has %s; export from the model (not a saved plan) for the closest setting, export --to pytorch runs it as planned, or plan with --solver megatron-selective or --solver every-k", strings.Join(parts, "; "))
}

// MegatronPipeline writes the Megatron-LM flags of a pipeline: its stages,
// its layer split when not even, the micro and global batch, and the
// recomputation every stage runs — the plan's own when m.Exact, else the
// closest setting, with what it costs against the plan. A header gives
// every stage's peak.
func MegatronPipeline(w io.Writer, m *planner.MegatronPipeline) error {
	plan, runs := m.Plan, m.Runs
	split, err := megatronSplit(plan.Pipeline)
	if err != nil {
		return fmt.Errorf("the pipeline of %s cannot be written as Megatron-LM flags: %v", comment(plan.Model), err)
	}
	var b strings.Builder
	extra := "compute"
	if plan.Unit == planner.TimeUnit {
		extra = "time" // the step's, bubble included
	}
	fmt.Fprintf(&b, "# The activation plan of %s for Megatron-LM on %d pipeline stages, made by ckptplan.\n", comment(plan.Model), plan.Pipeline.Stages)
	if m.Exact {
		fmt.Fprintf(&b, "# Every stage runs the plan as planned: largest peak %v, %.1f%% extra %s.\n", plan.PeakBytes, 100*plan.Overhead, extra)
	} else {
		fmt.Fprintf(&b, "# The plan (%s solver: largest peak %v, %.1f%% extra %s) chooses per layer and per stage,\n", plan.Solver, plan.PeakBytes, 100*plan.Overhead, extra)
		fmt.Fprintf(&b, "# which Megatron-LM's flags cannot say. The closest setting they can, and the cheapest that fits\n")
		fmt.Fprintf(&b, "# every stage: largest peak %v, %.1f%% extra %s.\n", runs.PeakBytes, 100*runs.Overhead, extra)
	}
	for _, d := range runs.Devices {
		fmt.Fprintf(&b, "# Stage %d: peak %v (static %v + activations %v), %s.\n", d.Rank, d.PeakBytes, d.StaticBytes, d.ActivationPeakBytes, flightNote(d))
	}
	fmt.Fprintf(&b, "--pipeline-model-parallel-size %d\n", plan.Pipeline.Stages)
	if split != "" {
		fmt.Fprintf(&b, "%s\n", split)
	}
	if s := plan.Setup; s != nil {
		fmt.Fprintf(&b, "--micro-batch-size %d\n--global-batch-size %d\n", s.Batch, s.Batch*int64(plan.Pipeline.Microbatches)*max(s.Parallel.DP, 1))
	}
	if f := recomputeFlags(m.Setting); f != "" {
		fmt.Fprintf(&b, "%s\n", f)
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// recomputeFlags are a setting's Megatron-LM flags ("" for none): for
// modules other than the default, --recompute-modules, after a comment
// where they act only on some of Megatron-LM's layers.
func recomputeFlags(r planner.MegatronRecompute) string {
	switch {
	case r.Modules == costmodel.CoreAttn:
		return "--recompute-granularity selective"
	case r.Selective():
		var note string
		if r.Modules&costmodel.LayerNorm != 0 {
			note = "# layernorm recomputes the norms where they are modules of their own (--transformer-impl local);\n" +
				"# Transformer Engine's layers fuse each norm into the next linear, which keeps the norm's output.\n"
		}
		return note + "--recompute-granularity selective --recompute-modules " + r.Modules.String()
	case r.Block > 0:
		return fmt.Sprintf("--recompute-granularity full --recompute-method block --recompute-num-layers %d", r.Block)
	}
	return ""
}

func flightNote(d planner.DevicePlan) string {
	var n []string
	for _, c := range d.Chunks {
		n = append(n, strconv.Itoa(c.InFlight))
	}
	if len(n) == 1 && n[0] == "1" {
		return "1 microbatch in flight"
	}
	return strings.Join(n, " + ") + " microbatches in flight"
}

// megatronSplit returns the flags of a pipeline's layer split beyond
// --pipeline-model-parallel-size: none for an even one, the interleaved
// schedule's chunk size, or the first and last stages' layers when only
// they differ (Megatron-LM splits the rest evenly).
func megatronSplit(pp planner.Pipeline) (string, error) {
	l := pp.Layers
	even := true
	for _, n := range l {
		even = even && n == l[0]
	}
	switch {
	case even && pp.Virtual > 1:
		return fmt.Sprintf("--num-layers-per-virtual-pipeline-stage %d", l[0]), nil
	case even:
		return "", nil
	case pp.Virtual > 1:
		return "", fmt.Errorf("the interleaved schedule needs the same layers in every chunk, not %v", l)
	}
	mid := l[1 : len(l)-1]
	for _, n := range mid {
		if n != mid[0] {
			return "", fmt.Errorf("Megatron-LM splits the layers evenly but for the first and last stages, not as %v", l)
		}
	}
	var f []string
	if len(mid) == 0 || l[0] != mid[0] {
		f = append(f, fmt.Sprintf("--decoder-first-pipeline-num-layers %d", l[0]))
	}
	if len(mid) == 0 || l[len(l)-1] != mid[0] {
		f = append(f, fmt.Sprintf("--decoder-last-pipeline-num-layers %d", l[len(l)-1]))
	}
	return strings.Join(f, "\n"), nil
}
