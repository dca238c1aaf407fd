package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/export"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/planner/figure"
	"github.com/ckptplan/ckptplan/solver"
)

// planFlags are the flags of plan and compare.
type planFlags struct {
	setup   *setupFlags
	budget  mem.Bytes
	solver  string
	device  string
	reserve reserveFlag
	slots   int
	k       int
	modules string // --recompute-modules
	runtime planner.Runtime
	// objective and roofline are --objective and --roofline; timing is
	// the roofline the costs are priced on (load), nil for FLOPs.
	objective string
	roofline  rooflineFlag
	timing    *costmodel.Roofline
}

// budgetFlag is --budget: a size, where a bare number under a mebibyte
// is refused as a size that lost its unit (24 for 24GiB), not taken as
// bytes no model fits in.
type budgetFlag struct{ b *mem.Bytes }

func (f budgetFlag) String() string {
	if f.b == nil || *f.b == 0 {
		return ""
	}
	return f.b.String()
}

func (f budgetFlag) Set(s string) error {
	v, err := mem.ParseBytes(s)
	if err != nil {
		return err
	}
	t := strings.TrimSpace(s)
	if v < mem.MiB && t != "" && strings.Trim(t, "0123456789") == "" {
		return fmt.Errorf("%s is %s bytes, which no model fits in: give the unit (%sGiB), or write %sB for bytes", t, t, t, t)
	}
	*f.b = v
	return nil
}

// reserveFlag is --reserve: unset, the device's default reserve.
type reserveFlag struct {
	set   bool
	bytes mem.Bytes
}

func (r *reserveFlag) String() string {
	if !r.set {
		return ""
	}
	return r.bytes.String()
}

func (r *reserveFlag) Set(s string) error {
	b, err := mem.ParseBytes(s)
	if err != nil {
		return err
	}
	r.set, r.bytes = true, b
	return nil
}

// value is the planner's Options.Reserve.
func (r *reserveFlag) value() mem.Bytes {
	switch {
	case !r.set:
		return 0
	case r.bytes == 0:
		return planner.NoReserve
	}
	return r.bytes
}

// parseModules reads --recompute-modules: Megatron-LM's module names,
// separated by commas or spaces; "" for none given.
func parseModules(s string) (costmodel.Module, error) {
	var m costmodel.Module
	for _, name := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		x, err := costmodel.ParseModule(name)
		if err != nil {
			return 0, err
		}
		if m&x != 0 {
			return 0, fmt.Errorf("%s is given twice", name)
		}
		m |= x
	}
	if m == 0 && strings.TrimSpace(s) != "" {
		return 0, fmt.Errorf("no module in %q", s)
	}
	return m, nil
}

func addPlanFlags(fs *flag.FlagSet, withSolver bool) *planFlags {
	p := &planFlags{setup: addSetupFlags(fs)}
	p.setup.addTrainingFlags(fs)
	fs.Var(budgetFlag{&p.budget}, "budget", "memory of one GPU, static memory included: a size with its unit (24GiB is 24·2³⁰ bytes, 80GB 80·10⁹, 4096B 4096 bytes), or bytes from 1MiB; default: the --device's memory")
	if withSolver {
		var names []string
		for _, s := range planner.Strategies {
			names = append(names, s.Name)
		}
		fs.StringVar(&p.solver, "solver", planner.Selective.Name, "strategy: "+strings.Join(names, " | "))
		fs.StringVar(&p.modules, "recompute-modules", "", "megatron-selective: the modules every layer recomputes, Megatron-LM's --recompute-modules, comma-separated: "+strings.Join(costmodel.ModuleNames(), " | ")+" (default: core_attn)")
	}
	fs.StringVar(&p.device, "device", "", "GPU, whose memory is the budget and sets the reserve: "+strings.Join(costmodel.DeviceNames(), " | ")+", or its memory (24GiB)")
	fs.Var(&p.reserve, "reserve", "memory of the budget left for what is not a tensor: CUDA context, workspaces, allocator slack (default: the --device's, 1GiB + 5% of its memory; none without --device)")
	fs.IntVar(&p.slots, "slots", solver.DefaultSlots, "memory slots of the optimal solver (more: finer, slower)")
	fs.IntVar(&p.k, "k", 1, "every-k: checkpoint every k-th stage")
	fs.StringVar(&p.objective, "objective", "", "what the plan minimizes: time (each op priced on the device's roofline) | flops (default: time with --roofline, or with a --device whose figures ckptplan knows; flops otherwise)")
	fs.Var(&p.roofline, "roofline", "the device's figures, for time: matrix=FLOP/s,bandwidth=B/s[,fp32=FLOP/s][,attention=FLOP/s][,launch=SECONDS][,matrix-efficiency=E][,bandwidth-efficiency=E][,sync] (sync: the host runs the ops, as on a CPU; efficiencies default to 1, figures measured as reached) (default: the --device's datasheet figures)")
	addRuntimeFlag(fs, &p.runtime)
	return p
}

// problem builds src's problem, its costs in time or FLOPs as load
// decided.
func (p *planFlags) problem(src *graphio.Source) (*planner.Problem, error) {
	return planner.NewTimed(src, p.timing)
}

// resolveObjective sets timing from --objective, --roofline and
// --device.
func (p *planFlags) resolveObjective() error {
	var r *costmodel.Roofline
	if p.roofline.set {
		r = &p.roofline.r
	} else if p.device != "" {
		if d, err := costmodel.LookupDevice(p.device); err == nil {
			if dr, ok := d.Roofline(); ok {
				r = &dr
			}
		}
	}
	switch p.objective {
	case "":
		// Time where the device's figures are known; FLOPs for a bare
		// budget or a device known by its memory alone.
		p.timing = r
	case "flops":
		if p.roofline.set {
			return usagef("--roofline prices time: it does not apply with --objective flops")
		}
	case "time":
		if r == nil {
			return usagef("--objective time prices each op on a device's figures: give a --device ckptplan knows (%s) or --roofline", strings.Join(costmodel.DeviceNames(), ", "))
		}
		p.timing = r
	default:
		return usagef("--objective: unknown value %q (valid: time, flops)", p.objective)
	}
	return nil
}

// addRuntimeFlag defines --runtime, what runs the plan.
func addRuntimeFlag(fs *flag.FlagSet, r *planner.Runtime) {
	*r = planner.PerLayer
	fs.Var(r, "runtime", "what runs the plan, which optimal and selective plan for: per-layer (a trainer's checkpointing, layer by layer: every export and ckptplan.apply) | nested (also reruns runs of layers from one checkpoint: the CPU executor's run)")
}

// parse parses the command line (one MODEL) and loads the model.
func (p *planFlags) parse(fs *flag.FlagSet, args []string) (*graphio.Source, *planner.Options, error) {
	arg, err := oneArg(fs, args, "MODEL")
	if err != nil {
		return nil, nil, err
	}
	return p.load(fs, arg)
}

// load reads MODEL, applies overrides and returns the source and options.
func (p *planFlags) load(fs *flag.FlagSet, arg string) (*graphio.Source, *planner.Options, error) {
	if p.budget <= 0 && p.device == "" {
		fs.Usage()
		return nil, nil, usagef("%s: need --budget or --device", fs.Name())
	}
	if p.slots <= 0 || p.k <= 0 {
		return nil, nil, usagef("%s: --slots and --k must be positive", fs.Name())
	}
	strategy, err := planner.ParseStrategy(p.solver)
	if err != nil {
		return nil, nil, usagef("--solver: %v", err)
	}
	modules, err := parseModules(p.modules)
	if err != nil {
		return nil, nil, usagef("--recompute-modules: %v", err)
	}
	if modules != 0 && strategy.Name != planner.MegatronSelective.Name {
		return nil, nil, usagef("--recompute-modules: the modules are megatron-selective's: add --solver megatron-selective")
	}
	if p.device != "" {
		if _, err := costmodel.LookupDevice(p.device); err != nil {
			return nil, nil, usagef("--device: %v", err)
		}
	}
	if err := p.resolveObjective(); err != nil {
		return nil, nil, err
	}
	src, err := p.setup.load(fs, arg)
	if err != nil {
		return nil, nil, err
	}
	if err := p.setup.applyTrainingTo(fs, src, arg); err != nil {
		return nil, nil, err
	}
	return src, &planner.Options{Budget: p.budget, Strategy: strategy, Modules: modules, Slots: p.slots, K: p.k, Device: p.device, Reserve: p.reserve.value(), Runtime: p.runtime}, nil
}

func runPlan(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("plan", "MODEL|CHAIN.yaml", stderr)
	pf := addPlanFlags(fs, true)
	timeline := fs.String("timeline", "", "also draw memory over the schedule to this .svg or .png file")
	pipe := addPipelineFlags(fs)
	format := addFormat(fs, "text", "json", "yaml")
	src, opt, err := pf.parse(fs, args)
	if err != nil {
		return err
	}
	pp, err := pipe.pipeline(fs)
	if err != nil {
		return err
	}
	if pp != nil && *timeline != "" {
		return usagef("--timeline draws one device's schedule: it does not apply with --pp")
	}
	p, err := pf.problem(src)
	if err != nil {
		return err
	}
	if pp != nil {
		return runPipeline(stdout, stderr, src, p, opt, pp, format.value)
	}
	plan, err := p.Plan(opt)
	if err != nil {
		return err
	}
	for _, n := range plan.Notes {
		fmt.Fprintf(stderr, "ckptplan: note: %s\n", n)
	}
	if !plan.Feasible {
		return infeasible(src, p, opt, plan)
	}
	if *timeline != "" {
		if err := drawTimeline(*timeline, p, plan, nil); err != nil {
			return err
		}
	}
	return writeFormatted(stdout, format.value, plan, func(w io.Writer) error { return writePlanText(w, plan, inFLOPs(p, plan)) })
}

// inFLOPs says a plan priced in time in FLOPs as well: "; in FLOPs 3.85
// PFLOP, store-everything 2.95 PFLOP: 30.4% extra compute"; "" for a plan
// in FLOPs, or where its schedule cannot be priced so.
func inFLOPs(p *planner.Problem, plan *planner.Plan) string {
	if plan.Unit != planner.TimeUnit {
		return ""
	}
	_, again, err := p.InFLOPs(plan)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("; in FLOPs %s, store-everything %s: %.1f%% extra compute", costString(again.Cost, again.Unit), costString(again.BaselineCost, again.Unit), 100*again.Overhead)
}

// drawTimeline draws a plan's memory over its schedule, with the measured
// per-op peaks when given.
func drawTimeline(path string, p *planner.Problem, plan *planner.Plan, measured []mem.Bytes) error {
	sched, err := p.Schedule(plan)
	if err != nil {
		return err
	}
	sim, err := solver.Simulate(p.Chain, sched)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("%s, %s solver: memory over the schedule", plan.Model, plan.Solver)
	var step *figure.Step
	if m := p.StepMoment(); m != nil && measured == nil {
		step = &figure.Step{Static: m.StaticBytes, Gradients: m.GradientsBytes, Activations: m.ActivationsBytes, Transient: m.TransientBytes}
	}
	fig, err := figure.Timeline(title, plan.StaticBytes, plan.BudgetBytes, sim, step, measured)
	if err != nil {
		return err
	}
	return writeFigure(path, fig)
}

func infeasible(src *graphio.Source, prob *planner.Problem, opt *planner.Options, p *planner.Plan) error {
	reserve := ""
	if p.ReserveBytes > 0 {
		reserve = fmt.Sprintf(", %v of it reserved for what is not a tensor (--reserve)", p.ReserveBytes)
	}
	err := &infeasibleError{minBudgetBytes: int64(p.MinBudgetBytes)}
	head := fmt.Sprintf("%s does not fit in %v%s with the %s solver", p.Model, p.BudgetBytes, reserve, p.Solver)
	if p.MinBudgetBytes > 0 {
		head += fmt.Sprintf(": it needs at least %v (%d bytes)", p.MinBudgetBytes, p.MinBudgetBytes)
	}
	why := whyNotFit(prob, opt, p)
	if why == "" && p.MinBudgetBytes == 0 {
		why = fmt.Sprintf(": static memory alone is %v", p.StaticBytes)
	}
	err.msg = head + why + leastChange(src, prob, opt, p)
	return err
}

// whyNotFit says, for a plan that does not fit, which part of its least
// peak passes the budget: the static memory (what it is, and its largest
// part), or the activations and working memory beyond it, when they peak
// and their largest part (planner.Shortfall).
func whyNotFit(prob *planner.Problem, opt *planner.Options, p *planner.Plan) string {
	if p.Static == nil || p.Setup == nil {
		return ""
	}
	static := mem.Bytes(p.Static.Total())
	why := fmt.Sprintf(": static memory %v (%s)", static, staticParts(p.Setup, p.Static))
	sf, err := prob.Shortfall(opt)
	if err != nil {
		sf = nil
	}
	var pageable mem.Bytes
	if sf != nil {
		pageable = sf.PageableBytes
	}
	if static-pageable+p.ReserveBytes >= p.BudgetBytes || sf != nil && sf.StaticPasses() {
		why += " passes the budget alone"
		if pageable > 0 {
			why += fmt.Sprintf(" even with %v of it, the optimizer's paged state, on the host", pageable)
		}
		if sf != nil {
			why += fmt.Sprintf(", most of it %s (%v)", sf.Term, sf.TermBytes)
		}
		return why
	}
	if sf != nil && sf.At != "" {
		return why + ", and " + sf.Beyond()
	}
	if more := p.MinBudgetBytes - static - p.ReserveBytes; p.MinBudgetBytes > 0 && more > 0 {
		why += fmt.Sprintf(", and at least %v of activations and working memory at the peak", more)
	}
	return why
}

// leastChange names the least change of the setup that fits, as fit
// finds it for the same sequences a step over the same GPUs: "; --batch 4
// --grad-accum 2 fits, the same 8 sequences a step (...)". Without one
// (a graph, a pipeline, or nothing fits), the settings that hold less.
func leastChange(src *graphio.Source, prob *planner.Problem, opt *planner.Options, p *planner.Plan) string {
	if p.Setup == nil || src.Kind != graphio.KindModel {
		return ""
	}
	base := *p.Setup
	hints := staticHints(&base)
	if p.Static != nil && mem.Bytes(p.Static.Total())+p.ReserveBytes < p.BudgetBytes {
		hints = "; a smaller --batch or --seq holds less"
	}
	if change := fitsInstead(src, prob, opt, base, nil); change != "" {
		return change
	}
	return hints
}

// fitsInstead names the least change of base that fits, as fit finds it
// for the same sequences a step (base's batch times its accumulation,
// or pipe's microbatches, times its data-parallel ranks) over the same
// GPUs (pipe's stages times base's tensor- and data-parallel ranks):
// "; --batch 4 --grad-accum 2 fits, the same 8 sequences a step (...)";
// "" where none does, or fit cannot search it (the sequences do not
// divide over the GPUs).
func fitsInstead(src *graphio.Source, prob *planner.Problem, opt *planner.Options, base ir.Setup, pipe *planner.Pipeline) string {
	build, err := planner.ModelBuilder(src, prob.Roofline)
	if err != nil {
		return ""
	}
	stages, accum := int64(1), max(base.GradAccum, 1)
	if pipe != nil {
		stages, accum = int64(pipe.Stages), int64(pipe.Microbatches)
		base.GradAccum = 1 // a pipeline's accumulation is its microbatches
	}
	dp := max(base.Parallel.DP, 1)
	if base.Batch > planner.MaxGlobalBatch/accum/dp {
		return "" // past any global batch fit searches
	}
	global := base.Batch * accum * dp
	gpus := stages * max(base.Parallel.TP, 1) * dp
	fit, err := build.Fit(base, opt, planner.FitOptions{GPUs: gpus, GlobalBatch: global})
	if err != nil || fit.LeastChange < 0 {
		return ""
	}
	st := fit.Settings[fit.LeastChange]
	flags := strings.Join(settingFlags(base, st, fit.Solver), " ")
	switch {
	case pipe != nil && st.Change.PP <= 1:
		flags += " without --pp and the pipeline's other flags" // a pipeline's flags are not its setup's
	case pipe != nil && (pipe.Virtual > 1 || pipe.Layers != nil):
		flags += " under 1F1B with the layers split evenly (without --pp-schedule, --virtual-stages and --pp-layers)"
	}
	seqs := "the same sequence a step"
	if global > 1 {
		seqs = fmt.Sprintf("the same %d sequences a step", global)
	}
	return fmt.Sprintf("; %s fits, %s (%s: peak %v, %.1f%% extra %s), and 'ckptplan fit' ranks the settings that do",
		flags, seqs, st.Name, st.PeakBytes, 100*st.Overhead, extra(fit.Unit))
}

// staticHints names the settings s does not use yet that hold less
// static memory: LoRA, 4-bit weights under it, an 8-bit optimizer,
// sharding over GPUs; more, placed first, where given.
func staticHints(s *ir.Setup, more ...string) string {
	hints := more
	if s.LoRA.Rank == 0 {
		hints = append(hints, "LoRA (--lora-rank)")
	}
	if s.Quant == "" {
		hints = append(hints, "4-bit weights under LoRA (--quant nf4)")
	}
	if !costmodel.Bitsandbytes(s.Optimizer) {
		hints = append(hints, "an 8-bit optimizer (--optimizer adamw8bit)")
	}
	if s.Parallel.Zero < 3 {
		hints = append(hints, "sharding over GPUs (--zero, --dp)")
	}
	if len(hints) == 0 {
		return ""
	}
	last := len(hints) - 1
	if last == 0 {
		return "; " + hints[0] + " holds less"
	}
	return "; " + strings.Join(hints[:last], ", ") + " or " + hints[last] + " hold less"
}

// loraString describes the setup's LoRA adapters for the line of what a
// plan assumes: ", LoRA rank 16 on q,v (fp32 adapters)"; "" without them.
func loraString(s *ir.Setup) string {
	if s.LoRA.Rank <= 0 {
		return ""
	}
	targets := make([]string, len(s.LoRA.Targets))
	for i, t := range s.LoRA.Targets {
		targets[i] = string(t)
	}
	dtype := s.DType
	if s.LoRA.FP32 {
		dtype = "fp32"
	}
	out := fmt.Sprintf(", LoRA rank %d, alpha %g, on %s (%s adapters)", s.LoRA.Rank, s.LoRA.Alpha, strings.Join(targets, ","), dtype)
	if s.LoRA.Dropout > 0 {
		out = strings.TrimSuffix(out, ")") + fmt.Sprintf(", dropout %g)", s.LoRA.Dropout)
	}
	return out
}

func writePlanText(w io.Writer, p *planner.Plan, also string) error {
	fmt.Fprintf(w, "%s with the %s solver in %v: peak %v + reserve %v\n", p.Model, p.Solver, p.BudgetBytes, p.PeakBytes, p.ReserveBytes)
	if m := p.Peak; m != nil {
		fmt.Fprintf(w, "peak in the %s: static %v + gradients %v + activations %v + working memory %v", m.At, m.StaticBytes, m.GradientsBytes, m.ActivationsBytes, m.TransientBytes)
		if m.PagedOutBytes > 0 {
			fmt.Fprintf(w, " − optimizer state paged to the host %v", m.PagedOutBytes)
		}
		fmt.Fprintln(w)
	}
	if p.PagedOutBytes > 0 {
		fmt.Fprintf(w, "paged: the GPU holds the plan only with %v of the optimizer's paged state on the host at the peak, which the driver moves there and back each step", p.PagedOutBytes)
		if p.PagingCost > 0 {
			fmt.Fprintf(w, " (at least %s over the host link)", costString(p.PagingCost, p.Unit))
		}
		fmt.Fprintln(w)
	}
	if s := p.Setup; s != nil {
		fmt.Fprintf(w, "assumes batch %d, sequence %d, %s, %s attention, %s profile, %s", s.Batch, s.Seq, precision(s.DType, s.Autocast), s.Attention, profileName(s.Profile, s.Transformers), costmodel.OptimizerName(s.Optimizer))
		if s.MasterWeights == ir.MasterNone && s.DType != "fp32" {
			fmt.Fprintf(w, " (%s moments, no master copy)", s.DType)
		}
		fmt.Fprint(w, loraString(s))
		if s.GradAccum > 1 {
			fmt.Fprintf(w, ", %d micro-batches a step", s.GradAccum)
		}
		if sh := s.Parallel.Sharder(); sh != "" && s.Profile != costmodel.Megatron {
			fmt.Fprintf(w, ", ZeRO %d on %s over %d ranks", s.Parallel.Zero, sh, s.Parallel.DP)
			if s.Parallel.Reshard == ir.ReshardAllButLast {
				fmt.Fprint(w, ", the last layer kept gathered after its forward")
			}
		}
		if p.StepPeakBytes > 0 {
			fmt.Fprintf(w, "; its step holds %v", p.StepPeakBytes)
		}
		fmt.Fprintln(w)
		if st := p.Static; st != nil && (s.Quant != "" || costmodel.Bitsandbytes(s.Optimizer)) {
			fmt.Fprintf(w, "static: %s\n", staticParts(s, st))
		}
	}
	if p.Unit == planner.TimeUnit {
		step, base := p.StepCost()
		parts := "forward and backward " + costString(p.Cost, p.Unit)
		if m := p.MicroBatches(); m > 1 {
			parts = fmt.Sprintf("%d micro-batches' forward and backward of %s each", m, costString(p.Cost, p.Unit))
		}
		if p.Comm != nil {
			parts += ", collectives not hidden " + costString(p.CommCost(), p.Unit)
		}
		if p.PagingCost > 0 {
			parts += ", paging " + costString(p.PagingCost, p.Unit)
		}
		fmt.Fprintf(w, "step time (estimated on the device's roofline) %s: %s, optimizer step %s; store-everything %s: %.1f%% extra %s%s\n",
			costString(step, p.Unit), parts, costString(p.UpdateCost, p.Unit), costString(base, p.Unit), 100*p.Overhead, extra(p.Unit), also)
	} else {
		fmt.Fprintf(w, "cost %s, store-everything %s: %.1f%% extra %s%s\n", costString(p.Cost, p.Unit), costString(p.BaselineCost, p.Unit), 100*p.Overhead, extra(p.Unit), also)
	}
	if s := p.Setup; s != nil && p.Unit != planner.TimeUnit && s.Profile == ir.ProfileTorchEager && slices.ContainsFunc(p.Stages, func(s planner.Stage) bool { return s.Decision == planner.DecisionSelective }) {
		// The executor (ckptplan run) recomputes what a dropped tensor
		// needs; PyTorch before 2.4, as this profile runs it, reruns a
		// selective layer's whole forward, and its exports count that.
		if e, err := export.FromPlan(p); err == nil && e.Overhead != p.Overhead {
			fmt.Fprintf(w, "exported to PyTorch, a selective layer reruns its whole forward before PyTorch 2.4 (the torch-eager profile's): %.1f%% extra compute; 'ckptplan run' executes the plan as costed here\n", 100*e.Overhead)
		}
	}
	fmt.Fprintf(w, "fits, %v spare", p.BudgetBytes-p.PeakBytes-p.ReserveBytes)
	priced := ""
	if p.Unit == planner.TimeUnit {
		priced = " with its figures in FLOPs, as runtimes count them"
	}
	if slices.ContainsFunc(p.Stages, func(s planner.Stage) bool { _, _, ok := layerIndex(s.Name); return ok }) {
		fmt.Fprintf(w, "; 'ckptplan export' with the same flags writes it for a trainer (--to hf, pytorch, fsdp2, deepspeed, megatron, torchtitan)%s; ckptplan.apply runs it in Python", priced)
	}
	fmt.Fprint(w, "\n\n")
	selective := false
	for _, s := range p.Stages {
		selective = selective || s.Option != ""
	}
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "stage\tname\tdecision\tinput\tsaved\tkept\tforward")
	if selective {
		fmt.Fprintf(tw, "\tkeep set")
	}
	fmt.Fprintln(tw)
	for _, g := range stageRuns(p.Stages) {
		s := g.first
		index, name := fmt.Sprint(s.Index), s.Name
		if g.n > 1 {
			prefix, first, _ := layerIndex(s.Name)
			index, name = fmt.Sprintf("%d–%d", s.Index, s.Index+g.n-1), fmt.Sprintf("%s.%d–%d", prefix, first, first+g.n-1)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%v\t%v\t%s", index, name, s.Decision, s.InputBytes, s.SavedBytes, s.KeptBytes(), costString(s.Forward, p.Unit))
		if selective {
			fmt.Fprintf(tw, "\t%s", keepSetWords(&s))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// A stage with no keep set leaves its last cell empty.
	if _, err := io.WriteString(w, trimCells(table.String())); err != nil {
		return err
	}
	if p.Solver == planner.Selective.Name || p.Solver == planner.MegatronSelective.Name {
		fmt.Fprintf(w, "\nsaved: what storing a stage keeps; kept: what the plan's first forward keeps (selective: the keep set named)\n")
	}
	if selective {
		fmt.Fprintf(w, "keep set: what a selective stage's forward keeps for its backward, or what its backward recomputes first; --format json names each tensor\n")
	}
	return nil
}

// keepSetWords describes a selective stage's keep set: its policy's name
// where it has one, and what it keeps or recomputes in words.
func keepSetWords(s *planner.Stage) string {
	k := s.KeepSet()
	if k == nil {
		return s.Option
	}
	if strings.HasPrefix(s.Option, "keep(") || strings.HasPrefix(s.Option, "drop(") {
		return k.Words(s.Name)
	}
	return s.Option + ": " + k.Words(s.Name)
}

// stageRun is n consecutive stages that read alike in the plan's table:
// layers of one name and consecutive indices, with the same decision,
// sizes, forward cost and keep set.
type stageRun struct {
	first planner.Stage
	n     int
}

// stageRuns groups a plan's stages into runs, each printed as one row.
func stageRuns(stages []planner.Stage) []stageRun {
	var runs []stageRun
	for _, s := range stages {
		if k := len(runs) - 1; k >= 0 && sameRow(runs[k], s) {
			runs[k].n++
			continue
		}
		runs = append(runs, stageRun{first: s, n: 1})
	}
	return runs
}

func sameRow(r stageRun, s planner.Stage) bool {
	f := r.first
	prefix, i, ok := layerIndex(s.Name)
	fprefix, fi, fok := layerIndex(f.Name)
	return ok && fok && prefix == fprefix && i == fi+r.n && s.Index == f.Index+r.n &&
		s.Decision == f.Decision && s.InputBytes == f.InputBytes && s.SavedBytes == f.SavedBytes &&
		s.KeptBytes() == f.KeptBytes() && s.Forward == f.Forward && s.Option == f.Option
}

// layerIndex splits a stage name "layers.12" into "layers" and 12.
func layerIndex(name string) (prefix string, i int, ok bool) {
	dot := strings.LastIndexByte(name, '.')
	if dot < 0 {
		return "", 0, false
	}
	i, err := strconv.Atoi(name[dot+1:])
	return name[:dot], i, err == nil && i >= 0
}

func costString(v float64, unit string) string {
	switch unit {
	case "FLOPs":
		return flops(int64(v))
	case planner.TimeUnit:
		return seconds(v * 1e-12)
	}
	return fmt.Sprintf("%g %s", v, unit)
}

// seconds prints a time with a unit that keeps it between 1 and 1000:
// "1.24 s", "312.50 ms", "45.00 µs".
func seconds(s float64) string {
	switch {
	case s >= 1 || s == 0:
		return fmt.Sprintf("%.2f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	case s >= 1e-6:
		return fmt.Sprintf("%.2f µs", s*1e6)
	}
	return fmt.Sprintf("%.0f ns", s*1e9)
}

// extra names what a plan's overhead is of: "compute" for FLOPs, "time"
// on a roofline.
func extra(unit string) string {
	if unit == planner.TimeUnit {
		return "time"
	}
	return "compute"
}

func runCompare(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("compare", "MODEL|CHAIN.yaml", stderr)
	pf := addPlanFlags(fs, false)
	format := addFormat(fs, "text", "json")
	src, opt, err := pf.parse(fs, args)
	if err != nil {
		return err
	}
	p, err := pf.problem(src)
	if err != nil {
		return err
	}
	plans, err := p.Compare(opt)
	if err != nil {
		return err
	}
	if format.value == "json" {
		return writeJSON(stdout, plans)
	}
	fmt.Fprintf(stdout, "%s in %v (static %v, reserve %v)\n\n", plans[0].Model, plans[0].BudgetBytes, plans[0].StaticBytes, plans[0].ReserveBytes)
	paging := slices.ContainsFunc(plans, func(p *planner.Plan) bool { return p.PagedOutBytes > 0 })
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "solver\tfits\tpeak\toverhead")
	if paging { // a paged optimizer's state some plans hold on the host
		fmt.Fprintf(tw, "\tpaged to the host")
	}
	fmt.Fprintln(tw)
	for _, p := range plans {
		if !p.Feasible {
			need := "static memory alone is too large"
			if p.MinBudgetBytes > 0 {
				need = fmt.Sprintf("needs %v", p.MinBudgetBytes)
			}
			fmt.Fprintf(tw, "%s\tno\t%s\t\n", p.Solver, need)
			continue
		}
		fmt.Fprintf(tw, "%s\tyes\t%v\t%.1f%%", p.Solver, p.PeakBytes, 100*p.Overhead)
		if paging {
			fmt.Fprintf(tw, "\t%v", p.PagedOutBytes)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// staticParts spells out static memory (docs/costmodel.md), naming the
// quantization and a bitsandbytes optimizer: "weights 5.47 GiB (nf4
// linears, double quantization), gradients 160 MiB, optimizer 81.25 MiB
// (paged-adamw8bit, paged: …), dequantized weight 112 MiB, buffers 2 MiB".
func staticParts(s *ir.Setup, st *costmodel.Static) string {
	weights := ""
	if s.Quant != "" {
		weights = " (" + s.Quant.String() + " linears"
		if s.DoubleQuant {
			weights += ", double quantization"
		}
		weights += ")"
	}
	opt := ""
	if costmodel.Bitsandbytes(s.Optimizer) {
		opt = " (" + s.Optimizer.String()
		switch {
		case st.Paged && st.PagedBytes > 0:
			opt += fmt.Sprintf(", %v of it paged: the driver moves it to the host when the GPU runs short", mem.Bytes(st.PagedBytes))
		case st.Paged:
			opt += ", paged: none of it, no trained tensor having 10^5 elements"
		}
		opt += ")"
	}
	grads := ""
	if s.Parallel.NoSync && s.Parallel.Zero >= 2 && s.Parallel.DP > 1 {
		grads = " (whole: reduced once a step)"
	}
	out := fmt.Sprintf("weights %v%s, gradients %v%s, optimizer %v%s", mem.Bytes(st.WeightsBytes), weights,
		mem.Bytes(st.GradientsBytes), grads, mem.Bytes(st.OptimizerBytes), opt)
	for _, t := range costmodel.Terms {
		if b := st.Of(t); b > 0 {
			out += ", " + t.Describe(s, *st, mem.Bytes(b))
		}
	}
	return out
}

// rooflineFlag is --roofline: a device's figures as key=value pairs.
type rooflineFlag struct {
	set bool
	r   costmodel.Roofline
}

func (f *rooflineFlag) String() string {
	if !f.set {
		return ""
	}
	return fmt.Sprintf("matrix=%g,bandwidth=%g", f.r.MatrixFLOPS, f.r.BandwidthBytes)
}

func (f *rooflineFlag) Set(s string) error {
	r := costmodel.Roofline{MatrixEfficiency: 1, BandwidthEfficiency: 1, LinkEfficiency: 1, HostEfficiency: 1, Source: "--roofline " + s}
	fields := map[string]*float64{"matrix": &r.MatrixFLOPS, "fp32": &r.MatrixFP32FLOPS, "attention": &r.AttentionFLOPS,
		"bandwidth": &r.BandwidthBytes, "launch": &r.LaunchSeconds, "matrix-efficiency": &r.MatrixEfficiency,
		"bandwidth-efficiency": &r.BandwidthEfficiency, "link": &r.LinkBytes, "link-efficiency": &r.LinkEfficiency,
		"host": &r.HostBytes, "host-efficiency": &r.HostEfficiency}
	const keys = "keys: matrix, fp32, attention, bandwidth, launch, link, host, matrix-efficiency, bandwidth-efficiency, link-efficiency, host-efficiency; or sync"
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "sync" {
			r.Synchronous = true
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value (%s)", kv, keys)
		}
		k = strings.TrimSpace(k)
		field, known := fields[k]
		if !known {
			return fmt.Errorf("unknown key %q (%s)", k, keys)
		}
		if seen[k] {
			return fmt.Errorf("%s is given twice", k)
		}
		seen[k] = true
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("%s: %s is out of range", k, v)
		}
		if err != nil {
			return fmt.Errorf("%s: %q is not a number", k, v)
		}
		*field = x
	}
	if !seen["fp32"] {
		r.MatrixFP32FLOPS = r.MatrixFLOPS
	}
	if err := r.Check(); err != nil {
		return err
	}
	f.set, f.r = true, r
	return nil
}
