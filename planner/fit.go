package planner

// Fit: what a model's training fits in a device's memory.
//
// A plan answers for one batch and sequence. The question people bring
// is the other way round: how large a micro-batch or how long a
// sequence fits, and, for a global batch, which settings reach it —
// micro-batch and gradient accumulation, LoRA or QLoRA, an 8-bit
// optimizer, ZeRO, tensor parallelism or pipeline stages over the GPUs
// (fit_pipeline.go) — and at what compute.
//
// Fit answers by planning, not by formula. The peak of a step grows
// with the batch and the sequence (every activation has a batch and a
// sequence dimension, and the static memory has neither), so whether a
// size fits is monotone in it: Fit doubles the size until a plan no
// longer fits, then bisects between the last size that fitted and the
// first that did not, each probe a whole plan of the model built at
// that size (Builder). The answer is therefore exactly the plan's: the
// largest micro-batch Fit reports is one whose plan fits and one more
// is one whose plan does not, under the same budget, reserve and
// strategy. A search costs O(log n) plans; the settings are searched
// concurrently, and meet on the same setups (the base setting is the
// base; storing everything and planning probe the same small sizes), so
// each setup's problem is built, and each plan of it made, once
// (sharedPlans).
//
// A setting is ranked by the compute a GPU spends on each sequence of
// the step, recomputation included: the step's FLOPs (or time) over its
// sequences, times the GPUs that share them. Settings that do not fit come last, each with why
// (Shortfall).

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// A Builder builds a model's problem under a training setup: what Fit
// varies the batch, sequence and settings of.
type Builder func(ir.Setup) (*Problem, error)

// ModelBuilder returns the builder of src's model, which must be a model
// (bundled, YAML or config.json): a graph or chain fixes its sizes. Its
// problems cost in time on r (NewTimed), or in FLOPs where r is nil.
func ModelBuilder(src *graphio.Source, r *costmodel.Roofline) (Builder, error) {
	if src.Kind != graphio.KindModel {
		return nil, fmt.Errorf("%s: fit varies a model's batch and sequence, which a graph or profiled chain fixes: give a model or config.json", src.Name)
	}
	return func(s ir.Setup) (*Problem, error) {
		m := *src.Model
		m.Training = s
		m.Training.LoRA.Targets = slices.Clone(s.LoRA.Targets)
		c := *src
		c.Model = &m
		return NewTimed(&c, r)
	}, nil
}

// MaxGlobalBatch bounds a global batch and the GPUs Fit takes: 2^30
// sequences, far past any training run's.
const MaxGlobalBatch = 1 << 30

// FitOptions bound what Fit searches.
type FitOptions struct {
	// GPUs are the data-parallel ranks the settings train over; 0 or 1:
	// one GPU, whose settings do not shard.
	GPUs int64
	// GlobalBatch is the sequences a step trains on over every GPU,
	// which the settings reach by micro-batch and gradient accumulation;
	// 0: each setting's largest micro-batch, with the base's
	// accumulation.
	GlobalBatch int64
	// SeqMultiple is what the longest sequence is a multiple of (0: 64).
	SeqMultiple int64
	// MaxBatch and MaxSeq end the searches (0: 65536 and 1<<20).
	MaxBatch, MaxSeq int64
}

func (o FitOptions) withDefaults() FitOptions {
	o.GPUs = max(o.GPUs, 1)
	if o.SeqMultiple <= 0 {
		o.SeqMultiple = 64
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1 << 16
	}
	if o.MaxSeq <= 0 {
		o.MaxSeq = 1 << 20
	}
	return o
}

// Fit is what fits: the largest micro-batch and the longest sequence of
// the base setup, storing everything and planned, and the settings that
// reach the global batch, ranked.
type Fit struct {
	Model        string    `json:"model"`
	Unit         string    `json:"unit"` // of the costs: FLOPs, or TimeUnit
	Device       string    `json:"device,omitempty"`
	BudgetBytes  mem.Bytes `json:"budget_bytes"`
	ReserveBytes mem.Bytes `json:"reserve_bytes,omitempty"`
	Solver       string    `json:"solver"`
	GPUs         int64     `json:"gpus"`
	GlobalBatch  int64     `json:"global_batch,omitempty"`
	SeqMultiple  int64     `json:"seq_multiple"`
	Setup        ir.Setup  `json:"setup"`
	// Largest are the base setup's reach storing everything (solver
	// "none") and with the solver.
	Largest []Reach `json:"largest"`
	// Settings are ranked: those that fit by compute a sequence, then
	// those that do not, in the order they were tried.
	Settings []SettingFit `json:"settings"`
	// LeastChange indexes Settings: the first setting tried that fits,
	// the least change from the base (the base itself at another
	// micro-batch where that fits, an 8-bit optimizer or ZeRO before
	// LoRA, LoRA before QLoRA); -1 where none fits.
	LeastChange int `json:"least_change"`
}

// Reach is how far one strategy goes in the base setup: the largest
// micro-batch at its sequence, and the longest sequence (a multiple of
// FitOptions.SeqMultiple) at micro-batch 1. A zero size fits not even
// at its least; Max says the search stopped at its bound, or where the
// next size passes what int64 counts.
type Reach struct {
	Solver         string    `json:"solver"`
	Batch          int64     `json:"batch"`
	BatchPeakBytes mem.Bytes `json:"batch_peak_bytes,omitempty"`
	BatchOverhead  float64   `json:"batch_overhead"`
	BatchMax       bool      `json:"batch_max,omitempty"`
	Seq            int64     `json:"seq"`
	SeqPeakBytes   mem.Bytes `json:"seq_peak_bytes,omitempty"`
	SeqOverhead    float64   `json:"seq_overhead"`
	SeqMax         bool      `json:"seq_max,omitempty"`
}

// Change is a setting: what it changes in the base setup. Zero fields
// change nothing.
type Change struct {
	LoRARank  int64        `json:"lora_rank,omitempty"`
	Quant     ir.Quant     `json:"quant,omitempty"` // with double quantization
	Optimizer ir.Optimizer `json:"optimizer,omitempty"`
	// Zero is the ZeRO stage over the data-parallel ranks, -1 for plain
	// data parallelism; 0 keeps the base's.
	Zero int64 `json:"zero,omitempty"`
	// TP is the tensor-parallel ranks, which share each data-parallel
	// rank's sequences; 0 keeps the base's.
	TP int64 `json:"tp,omitempty"`
	// PP is the pipeline stages, each of TP ranks, that a data-parallel
	// replica spreads the model's layers over; 0: none.
	PP int64 `json:"pp,omitempty"`
}

// apply returns base changed, over gpus GPUs: its tensor-parallel ranks
// times its data-parallel ones.
func (c Change) apply(base ir.Setup, gpus int64) ir.Setup {
	s := base
	if c.LoRARank > 0 {
		s.LoRA.Rank = c.LoRARank
	}
	if c.Quant != "" {
		s.Quant, s.DoubleQuant = c.Quant, true
	}
	if c.Optimizer != "" {
		s.Optimizer = c.Optimizer
	}
	if c.TP > 0 {
		s.Parallel.TP = c.TP
	}
	s.Parallel.TP = max(s.Parallel.TP, 1)
	s.Parallel.SP = s.Parallel.SP && s.Parallel.TP > 1
	s.Parallel.DP = max(gpus/(s.Parallel.TP*max(c.PP, 1)), 1)
	if c.Zero != 0 {
		s.Parallel.Zero = max(c.Zero, 0)
	}
	if s.Parallel.DP == 1 {
		s.Parallel.Zero, s.Parallel.NoSync = 0, false
	}
	// The base's engine where it runs the stage: DeepSpeed runs 1 to 3,
	// FSDP2 only 3; otherwise the stage's default.
	if sh := s.Parallel.Sharding; s.Parallel.Zero == 0 || sh == ir.ShardingFSDP2 && s.Parallel.Zero != 3 {
		s.Parallel.Sharding = ""
	}
	// FSDP2's resharding where FSDP2 runs it, and PP never: a pipeline
	// keeps its own.
	if s.Parallel.Sharder() != ir.ShardingFSDP2 || c.PP > 1 {
		s.Parallel.Reshard = ""
	}
	return s
}

// Name says what the setting trains with: "full fine-tune, AdamW
// (foreach), ZeRO 3 over 8 GPUs".
func (c Change) Name(s ir.Setup) string {
	var parts []string
	switch {
	case s.Quant != "":
		parts = append(parts, fmt.Sprintf("QLoRA r%d (%s)", s.LoRA.Rank, s.Quant))
	case s.LoRA.Rank > 0:
		parts = append(parts, fmt.Sprintf("LoRA r%d", s.LoRA.Rank))
	default:
		parts = append(parts, "full")
	}
	parts = append(parts, string(s.Optimizer))
	if s.Parallel.TP > 1 {
		parts = append(parts, fmt.Sprintf("TP %d", s.Parallel.TP))
	}
	if c.PP > 1 {
		parts = append(parts, fmt.Sprintf("PP %d", c.PP))
	}
	switch p := s.Parallel; {
	case p.DP > 1 && p.Zero > 0:
		parts = append(parts, fmt.Sprintf("ZeRO %d over %d", p.Zero, p.DP))
	case p.DP > 1:
		parts = append(parts, fmt.Sprintf("DDP over %d", p.DP))
	}
	return strings.Join(parts, ", ")
}

// SettingFit is one setting and what it reaches.
type SettingFit struct {
	Name   string `json:"name"`
	Change Change `json:"change"`
	Fits   bool   `json:"fits"`
	// MicroBatch and GradAccum reach the global batch over the GPUs
	// (MicroBatch × GradAccum × GPUs), MicroBatch the largest divisor of a
	// GPU's share that fits; without a global batch, MicroBatch is the
	// largest that fits.
	MicroBatch int64     `json:"micro_batch,omitempty"`
	GradAccum  int64     `json:"grad_accum,omitempty"`
	PeakBytes  mem.Bytes `json:"peak_bytes,omitempty"`
	SpareBytes mem.Bytes `json:"spare_bytes,omitempty"`
	Overhead   float64   `json:"overhead"`
	// CostPerSequence is a GPU's cost (the plan's unit: FLOPs, or
	// picoseconds in time) for each sequence of its micro-batches,
	// recomputation included, times the tensor-parallel ranks that share
	// them; in time, with its share of the step's collectives and
	// optimizer step.
	CostPerSequence float64 `json:"cost_per_sequence,omitempty"`
	// Shortfall says why the setting does not fit at micro-batch 1.
	Shortfall *Shortfall `json:"shortfall,omitempty"`
	// Solver is the solver that plans a pipeline setting: selective in
	// time, optimal (each layer stored or checkpointed) in FLOPs; empty
	// for the others, which Fit's own plans.
	Solver string `json:"solver,omitempty"`
	// Setup is what the setting plans (its batch the micro-batch).
	Setup ir.Setup `json:"setup"`
}

// Fit searches what fits the budget of opt (its strategy plans every
// probe; Reach also stores everything) from base.
func (build Builder) Fit(base ir.Setup, opt *Options, fo FitOptions) (*Fit, error) {
	o, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	fo = fo.withDefaults()
	if fo.GlobalBatch > MaxGlobalBatch || fo.GPUs > MaxGlobalBatch {
		return nil, fmt.Errorf("a global batch over %d GPUs: at most %d of either", fo.GPUs, MaxGlobalBatch)
	}
	if tp := max(base.Parallel.TP, 1); fo.GPUs > 1 && fo.GPUs%tp != 0 {
		return nil, fmt.Errorf("%d GPUs do not divide into tensor-parallel groups of %d", fo.GPUs, tp)
	}
	sp := newSharedPlans(build)
	build = sp.problem
	first, err := build(base)
	if err != nil {
		return nil, err
	}
	f := &Fit{Model: first.Name, Unit: first.Unit, Device: o.Device, BudgetBytes: o.Budget, ReserveBytes: o.Reserve, Solver: o.Strategy.Name,
		GPUs: fo.GPUs, GlobalBatch: fo.GlobalBatch, SeqMultiple: fo.SeqMultiple, Setup: base}
	store := o
	store.Strategy = StoreAll
	strategies := []Options{store, o}
	if o.Strategy.Name == StoreAll.Name {
		strategies = strategies[:1]
	}
	f.Largest = make([]Reach, len(strategies))
	// A setting is valid where the model builds under it (not where its
	// heads do not divide over the tensor-parallel ranks) and has a layer
	// for each pipeline stage; a pipeline's model is its tensor-parallel
	// setting's, built once.
	built := map[Change]bool{}
	changes := settings(base, fo.GPUs, func(c Change) bool {
		if !first.canPipeline(c.PP) {
			return false
		}
		model := c
		model.Zero, model.PP = 0, 0
		ok, seen := built[model]
		if !seen {
			_, err := sp.built(c.apply(base, fo.GPUs))
			ok = err == nil
			built[model] = ok
		}
		return ok
	})
	f.Settings = make([]SettingFit, len(changes))
	errs := make([]error, len(strategies)+len(changes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	run := func(i int, do func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = do()
		}()
	}
	for i := range strategies {
		run(i, func() (err error) {
			f.Largest[i], err = reach(sp, base, &strategies[i], fo)
			return err
		})
	}
	for i, c := range changes {
		run(len(strategies)+i, func() (err error) {
			f.Settings[i], err = fitSetting(sp, base, c, &o, fo)
			return err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	gainsNothing := make([]bool, len(f.Settings))
	for i, s := range f.Settings {
		gainsNothing[i] = pagedGainsNothing(s, f.Settings)
	}
	kept := f.Settings[:0]
	for i, s := range f.Settings {
		if !gainsNothing[i] {
			kept = append(kept, s)
		}
	}
	f.Settings = kept
	order := make([]int, len(f.Settings))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		x, y := &f.Settings[a], &f.Settings[b]
		if x.Fits != y.Fits {
			if x.Fits {
				return -1
			}
			return 1
		}
		if !x.Fits {
			return 0
		}
		return cmp.Or(cmp.Compare(x.CostPerSequence, y.CostPerSequence), cmp.Compare(x.PeakBytes, y.PeakBytes))
	})
	ranked := make([]SettingFit, len(order))
	f.LeastChange = -1
	least := len(order)
	for i, k := range order {
		ranked[i] = f.Settings[k]
		if ranked[i].Fits && k < least {
			f.LeastChange, least = i, k
		}
	}
	f.Settings = ranked
	return f, nil
}

// settings lists the changes Fit tries from base, base's own first:
// full fine-tuning (where base is), LoRA and QLoRA (rank 16, or base's),
// an 8-bit optimizer, paged or not, where the full model trains, and over several GPUs
// data parallelism and ZeRO 1 to 3 (LoRA: DDP and ZeRO 3, which also
// shards the frozen weights; QLoRA: DDP) and, for full fine-tuning,
// tensor parallelism over 2, 4 or 8 of them and pipelines of 2, 4 or 8
// stages where valid says the model takes it.
func settings(base ir.Setup, gpus int64, valid func(Change) bool) []Change {
	rank := base.LoRA.Rank
	if rank == 0 {
		rank = 16
	}
	type method struct {
		c          Change
		full, lora bool
	}
	var methods []method
	switch {
	case base.Quant != "":
		methods = []method{{c: Change{}}}
	case base.LoRA.Rank > 0:
		methods = []method{{c: Change{}, lora: true}, {c: Change{Quant: ir.QuantNF4}}}
	default:
		methods = []method{{c: Change{}, full: true}, {c: Change{LoRARank: rank}, lora: true}, {c: Change{LoRARank: rank, Quant: ir.QuantNF4}}}
	}
	var out []Change
	for _, m := range methods {
		opts := []ir.Optimizer{""}
		if m.full && !costmodel.Bitsandbytes(base.Optimizer) {
			opts = append(opts, ir.OptimizerAdamW8bit, ir.OptimizerPagedAdamW8bit)
		}
		// The base's own stage first (0 keeps it), then the others.
		zeros := []int64{0}
		var others []int64
		switch {
		case gpus > 1 && m.full:
			others = []int64{-1, 1, 2, 3}
		case gpus > 1 && m.lora:
			others = []int64{-1, 3}
		case gpus > 1:
			others = []int64{-1}
		}
		own := base.Parallel.Zero
		if own <= 0 {
			own = -1
		}
		for _, z := range others {
			if z != own || m.c.Quant != "" && base.Quant == "" {
				zeros = append(zeros, z)
			}
		}
		if gpus > 1 && m.c.Quant != "" && base.Quant == "" {
			zeros = zeros[1:] // QLoRA from a full base: plain data parallelism
		}
		for _, z := range zeros {
			for _, opt := range opts {
				c := m.c
				c.Optimizer, c.Zero = opt, z
				if opt == ir.OptimizerPagedAdamW8bit && deepSpeedZeRO(base, z) {
					continue // one flat partition, updated at once: nothing pages
				}
				out = append(out, c)
			}
		}
		if !m.full {
			continue
		}
		// Tensor parallelism within a node of up to 8 GPUs, with ZeRO 1
		// (Megatron-LM's distributed optimizer) over the data-parallel
		// ranks left; from a base with tensor parallelism, none too.
		first := int64(2)
		if base.Parallel.TP > 1 {
			first = 1
		}
		for tp := first; tp <= min(gpus, 8); tp *= 2 {
			c := m.c
			c.TP, c.Zero = tp, 1
			if gpus/tp == 1 {
				c.Zero = -1
			}
			if gpus%tp == 0 && tp != base.Parallel.TP && valid(c) {
				out = append(out, c)
			}
		}
		// Pipeline stages of the most tensor-parallel ranks a node of 8
		// holds that the GPUs leave, the rest data-parallel under ZeRO 1.
		for _, pp := range pipelineStages {
			for tp := min(gpus/pp, 8); tp >= 1 && pp <= gpus; tp /= 2 {
				c := m.c
				c.PP, c.TP, c.Zero = pp, tp, 1
				if gpus/(pp*tp) == 1 {
					c.Zero = -1
				}
				if gpus%(pp*tp) == 0 && valid(c) {
					out = append(out, c)
					break
				}
			}
		}
	}
	return out
}

// deepSpeedZeRO reports whether base under ZeRO stage z (Change.Zero)
// runs it on DeepSpeed.
func deepSpeedZeRO(base ir.Setup, z int64) bool {
	p := base.Parallel
	if z != 0 {
		p.Zero = max(z, 0)
	}
	return p.Zero >= 1 && p.Sharder() == ir.ShardingDeepSpeed
}

// pagedGainsNothing reports whether s, a setting with a paged 8-bit
// optimizer, reaches no further than the same setting unpaged among
// settings: a paged plan pages only where the unpaged one does not fit,
// so where both fit the same micro-batches their plans are the same, and
// where neither fits paging does not help.
func pagedGainsNothing(s SettingFit, settings []SettingFit) bool {
	if s.Change.Optimizer != ir.OptimizerPagedAdamW8bit {
		return false
	}
	twin := s.Change
	twin.Optimizer = ir.OptimizerAdamW8bit
	for _, t := range settings {
		if t.Change == twin {
			return s.Fits == t.Fits && (!s.Fits || s.MicroBatch == t.MicroBatch && s.GradAccum == t.GradAccum)
		}
	}
	return false
}

// sharedPlans builds a Fit's problems and makes their plans, each once,
// whichever of its concurrent searches asks first. A problem's keep sets
// are searched before it is shared, so that Plan, which would otherwise
// search them on its first call, only reads it.
type sharedPlans struct {
	build    Builder
	mu       sync.Mutex
	problems map[string]*made[*sharedProblem]
	plans    map[planKey]*made[probe]
}

// sharedProblem is a problem and the search of its keep sets, once.
type sharedProblem struct {
	p      *Problem
	search sync.Once
}

// made is a value made once.
type made[T any] struct {
	once sync.Once
	v    T
	err  error
}

// planKey is a setup (printed whole) planned by one strategy: a Fit's
// options differ in nothing else.
type planKey struct{ setup, strategy string }

// probe is a setup's plan; tooLarge says its sizes pass what int64
// counts, and no budget holds it.
type probe struct {
	plan     *Plan
	tooLarge bool
}

func newSharedPlans(build Builder) *sharedPlans {
	return &sharedPlans{build: build, problems: map[string]*made[*sharedProblem]{}, plans: map[planKey]*made[probe]{}}
}

// once returns m's value for k, made by mk on the first call for k.
func once[K comparable, T any](mu *sync.Mutex, m map[K]*made[T], k K, mk func() (T, error)) (T, error) {
	mu.Lock()
	e, ok := m[k]
	if !ok {
		e = &made[T]{}
		m[k] = e
	}
	mu.Unlock()
	e.once.Do(func() { e.v, e.err = mk() })
	return e.v, e.err
}

// built returns s's problem, built once; its keep sets may not have
// been searched: it is not to be planned.
func (sp *sharedPlans) built(s ir.Setup) (*sharedProblem, error) {
	return once(&sp.mu, sp.problems, fmt.Sprintf("%#v", s), func() (*sharedProblem, error) {
		p, err := sp.build(s)
		return &sharedProblem{p: p}, err
	})
}

// problem is the Builder of the shared problems, their keep sets
// searched.
func (sp *sharedPlans) problem(s ir.Setup) (*Problem, error) {
	b, err := sp.built(s)
	if err != nil {
		return nil, err
	}
	b.search.Do(b.p.SearchKeepSets)
	return b.p, nil
}

// plan plans s under opt; its schedule is not kept.
func (sp *sharedPlans) plan(s ir.Setup, opt *Options) (probe, error) {
	return once(&sp.mu, sp.plans, planKey{fmt.Sprintf("%#v", s), opt.Strategy.Name}, func() (probe, error) {
		prob, err := sp.problem(s)
		var pl *Plan
		if err == nil {
			pl, err = prob.Plan(opt)
		}
		if errors.Is(err, ir.ErrTooLarge) || errors.Is(err, solver.ErrTooLarge) {
			return probe{plan: &Plan{Solver: opt.Strategy.Name}, tooLarge: true}, nil
		}
		if err != nil {
			return probe{}, err
		}
		pl.Schedule = nil
		return probe{plan: pl}, nil
	})
}

// prober plans a setup's sizes under one set of options.
type prober struct {
	shared *sharedPlans
	opt    *Options
	setup  ir.Setup
	// tooLarge are the sizes past what int64 counts.
	tooLarge map[[2]int64]bool
}

func newProber(sp *sharedPlans, s ir.Setup, opt *Options) *prober {
	return &prober{shared: sp, opt: opt, setup: s, tooLarge: map[[2]int64]bool{}}
}

// plan plans the setup at batch and seq; the plan says whether it fits.
func (p *prober) plan(batch, seq int64) (*Plan, error) {
	s := p.setup
	s.Batch, s.Seq = batch, seq
	pr, err := p.shared.plan(s, p.opt)
	if err != nil {
		return nil, err
	}
	if pr.tooLarge {
		p.tooLarge[[2]int64{batch, seq}] = true
	}
	return pr.plan, nil
}

// largest returns the largest n in [1, limit] whose plan size(n) fits,
// and its plan: 0 and size(1)'s plan when none does.
func (p *prober) largest(limit int64, size func(n int64) (batch, seq int64)) (int64, *Plan, error) {
	at := func(n int64) (*Plan, error) { b, s := size(n); return p.plan(b, s) }
	n, err := largestFitting(limit, func(n int64) (bool, error) {
		pl, err := at(n)
		return err == nil && pl.Feasible, err
	})
	if err != nil || limit < 1 {
		return 0, nil, err
	}
	pl, err := at(max(n, 1)) // planned already
	return n, pl, err
}

// largestFitting returns the largest n in [1, limit] that fits, 0 where
// 1 does not. Fitting is monotone in n; the search doubles, then bisects.
func largestFitting(limit int64, fits func(n int64) (bool, error)) (int64, error) {
	if limit < 1 {
		return 0, nil
	}
	if ok, err := fits(1); err != nil || !ok {
		return 0, err
	}
	lo := int64(1)
	hi := int64(0) // the least size known not to fit; 0: none yet
	for n := int64(2); ; n = min(n, limit/2+1) * 2 {
		if n > limit {
			n = limit
		}
		if n <= lo {
			return lo, nil
		}
		ok, err := fits(n)
		if err != nil {
			return 0, err
		}
		if !ok {
			hi = n
			break
		}
		lo = n
		if n == limit {
			return lo, nil
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := fits(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// largestDivisor returns the largest divisor of n no larger than m
// (1 ≤ m), over the divisor pairs (d, n/d) with d ≤ √n.
func largestDivisor(n, m int64) int64 {
	best := int64(1)
	for d := int64(1); d <= n/d; d++ {
		if n%d != 0 {
			continue
		}
		if d <= m {
			best = max(best, d)
		}
		if q := n / d; q <= m {
			best = max(best, q)
		}
	}
	return best
}

// reach searches the base setup's largest micro-batch and longest
// sequence under one strategy.
func reach(sp *sharedPlans, base ir.Setup, opt *Options, fo FitOptions) (Reach, error) {
	p := newProber(sp, base, opt)
	r := Reach{Solver: opt.Strategy.Name}
	b, pl, err := p.largest(fo.MaxBatch, func(n int64) (int64, int64) { return n, base.Seq })
	if err != nil {
		return r, err
	}
	r.Batch, r.BatchMax = b, b == fo.MaxBatch || p.tooLarge[[2]int64{b + 1, base.Seq}]
	if b > 0 {
		r.BatchPeakBytes, r.BatchOverhead = pl.PeakBytes, pl.Overhead
	}
	k, pl, err := p.largest(fo.MaxSeq/fo.SeqMultiple, func(n int64) (int64, int64) { return 1, n * fo.SeqMultiple })
	if err != nil {
		return r, err
	}
	r.Seq, r.SeqMax = k*fo.SeqMultiple, k == fo.MaxSeq/fo.SeqMultiple || p.tooLarge[[2]int64{1, (k + 1) * fo.SeqMultiple}]
	if k > 0 {
		r.SeqPeakBytes, r.SeqOverhead = pl.PeakBytes, pl.Overhead
	}
	return r, nil
}

// undivided says why a setting s cannot reach the global batch when its
// data-parallel ranks do not divide it (each runs an equal share); nil
// where they do, or without a global batch.
func undivided(s ir.Setup, opt *Options, fo FitOptions) *Shortfall {
	if dp := s.Parallel.DP; fo.GlobalBatch == 0 || fo.GlobalBatch%dp == 0 {
		return nil
	}
	return &Shortfall{BudgetBytes: opt.Budget, ReserveBytes: opt.Reserve,
		Reason: fmt.Sprintf("a global batch of %d sequences does not divide over its %d data-parallel ranks", fo.GlobalBatch, s.Parallel.DP)}
}

// ddpNoSync reports whether a setting reduces its gradients once a step
// where it accumulates them: plain data parallelism does, as the Hugging
// Face Trainer runs it (Accelerate's accumulate enters DDP's no_sync on
// every micro-batch but the last), which holds no more memory, DDP's
// gradients being whole already. ZeRO's stages keep the base's: DeepSpeed
// reduces stage 1's once a step on its own (costmodel.CollectivesOf) and
// stage 2's every micro-batch, and FSDP2 would hold its gradients whole
// (set_requires_gradient_sync).
func ddpNoSync(s ir.Setup) bool {
	return s.Parallel.DP > 1 && s.Parallel.Zero == 0 && s.GradAccum > 1
}

// fitSetting searches one setting: the micro-batch and accumulation that
// reach the global batch, or its largest micro-batch.
func fitSetting(sp *sharedPlans, base ir.Setup, c Change, opt *Options, fo FitOptions) (SettingFit, error) {
	if c.PP > 1 {
		return fitPipeline(sp.problem, base, c, opt, fo)
	}
	s := c.apply(base, fo.GPUs)
	sf := SettingFit{Name: c.Name(s), Change: c, Setup: s}
	if sf.Shortfall = undivided(s, opt, fo); sf.Shortfall != nil {
		return sf, nil
	}
	var pl *Plan
	switch share := fo.GlobalBatch / s.Parallel.DP; {
	case fo.GlobalBatch == 0:
		p := newProber(sp, s, opt)
		m, best, err := p.largest(fo.MaxBatch, func(n int64) (int64, int64) { return n, s.Seq })
		if err != nil {
			return sf, err
		}
		sf.MicroBatch, sf.GradAccum, pl = m, max(s.GradAccum, 1), best
	default:
		// One micro-batch of the whole share first; from two on, the
		// gradients are held through each, and the largest micro-batch
		// is searched so.
		one := s
		one.GradAccum = 1
		whole := &Plan{}
		if share <= fo.MaxBatch {
			var err error
			if whole, err = newProber(sp, one, opt).plan(share, s.Seq); err != nil {
				return sf, err
			}
		}
		pl = whole
		sf.MicroBatch, sf.GradAccum = share, 1
		if !whole.Feasible {
			sf.MicroBatch, sf.GradAccum = 0, 0
			if share > 1 {
				acc := s
				acc.GradAccum = 2
				acc.Parallel.NoSync = acc.Parallel.NoSync || ddpNoSync(acc)
				p := newProber(sp, acc, opt)
				m, _, err := p.largest(min(share-1, fo.MaxBatch), func(n int64) (int64, int64) { return n, s.Seq })
				if err != nil {
					return sf, err
				}
				if m > 0 {
					m = largestDivisor(share, m)
					sf.MicroBatch, sf.GradAccum = m, share/m
					sf.Setup.Parallel.NoSync = acc.Parallel.NoSync
					if pl, err = p.plan(m, s.Seq); err != nil {
						return sf, err
					}
				}
			}
		}
	}
	if sf.MicroBatch == 0 {
		sf.MicroBatch, sf.GradAccum = 0, 0
		one := s
		one.Batch = 1
		switch {
		case fo.GlobalBatch > fo.GPUs:
			one.GradAccum = 2
		case fo.GlobalBatch > 0:
			one.GradAccum = 1
		}
		prob, err := sp.problem(one)
		if err != nil {
			return sf, err
		}
		sf.Shortfall, err = prob.Shortfall(opt)
		return sf, err
	}
	sf.Setup.Batch, sf.Setup.GradAccum = sf.MicroBatch, sf.GradAccum
	sf.Fits = true
	sf.PeakBytes, sf.Overhead = pl.PeakBytes, pl.Overhead
	sf.SpareBytes = pl.BudgetBytes - pl.ReserveBytes - pl.PeakBytes
	// A GPU's cost a sequence: the tensor-parallel ranks share each
	// sequence's.
	tp := float64(s.Parallel.TP)
	sf.CostPerSequence = pl.Cost * tp / float64(sf.MicroBatch)
	if pl.Unit == TimeUnit {
		// The plan stands for every micro-batch of the step, which ends
		// with one optimizer step.
		cost, base := pl.stepOf(sf.GradAccum)
		sf.CostPerSequence = cost * tp / float64(sf.MicroBatch*sf.GradAccum)
		if base > 0 {
			sf.Overhead = cost/base - 1
		}
	}
	return sf, nil
}
