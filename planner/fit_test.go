package planner

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/google/go-cmp/cmp"
)

// fitBuilder returns a bundled model's builder and its setup.
func fitBuilder(t *testing.T, name string) (Builder, ir.Setup) {
	t.Helper()
	src, err := graphio.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	build, err := ModelBuilder(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return build, src.Model.Training
}

// fits plans s at batch and seq directly.
func fits(t *testing.T, build Builder, s ir.Setup, batch, seq int64, opt *Options) bool {
	t.Helper()
	s.Batch, s.Seq = batch, seq
	p, err := build(s)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(opt)
	if err != nil {
		t.Fatal(err)
	}
	return plan.Feasible
}

// fitsSetting is fits for a setting at a micro-batch and its
// accumulation: over a pipeline's stages, a pipeline plan of that many
// microbatches whose devices store or checkpoint each layer.
func fitsSetting(t *testing.T, build Builder, st SettingFit, s ir.Setup, batch int64, opt *Options) bool {
	t.Helper()
	if st.Change.PP <= 1 {
		return fits(t, build, s, batch, s.Seq, opt)
	}
	return pipelineAt(t, build, st, s, batch, opt).Feasible
}

// pipelineAt is a pipeline setting's plan at a micro-batch and its
// accumulation's microbatches.
func pipelineAt(t *testing.T, build Builder, st SettingFit, s ir.Setup, batch int64, opt *Options) *PipelinePlan {
	t.Helper()
	s.Batch = batch
	p, err := build(s)
	if err != nil {
		t.Fatal(err)
	}
	o := *opt
	o.Strategy = Optimal
	plan, err := p.PlanPipeline(&o, Pipeline{Stages: int(st.Change.PP), Microbatches: int(s.GradAccum)})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestFitReach checks the searched largest micro-batch and longest
// sequence against plans of every size in turn, up to one past them.
func TestFitReach(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	for _, budget := range []mem.Bytes{4200 << 10, 5 << 20, 6 << 20, 9 << 20} {
		opt := &Options{Budget: budget}
		fit, err := build.Fit(base, opt, FitOptions{SeqMultiple: 16, MaxSeq: 4096, MaxBatch: 256})
		if err != nil {
			t.Fatal(err)
		}
		if len(fit.Largest) != 2 || fit.Largest[0].Solver != StoreAll.Name || fit.Largest[1].Solver != Selective.Name {
			t.Fatalf("%v: largest %+v", budget, fit.Largest)
		}
		for _, r := range fit.Largest {
			o := &Options{Budget: budget, Strategy: StoreAll}
			if r.Solver == Selective.Name {
				o.Strategy = Selective
			}
			var batch int64
			for batch < 256 && fits(t, build, base, batch+1, base.Seq, o) {
				batch++
			}
			var seq int64
			for seq < 4096 && fits(t, build, base, 1, seq+16, o) {
				seq += 16
			}
			if r.Batch != batch || r.Seq != seq {
				t.Errorf("%v, %s: fit says batch %d and sequence %d; planning each size says %d and %d", budget, r.Solver, r.Batch, r.Seq, batch, seq)
			}
			if r.Batch > 0 && r.BatchPeakBytes > budget || r.Seq > 0 && r.SeqPeakBytes > budget {
				t.Errorf("%v, %s: peaks %v and %v", budget, r.Solver, r.BatchPeakBytes, r.SeqPeakBytes)
			}
		}
		if fit.Largest[1].Batch < fit.Largest[0].Batch || fit.Largest[1].Seq < fit.Largest[0].Seq {
			t.Errorf("%v: planned %+v reaches less than storing everything %+v", budget, fit.Largest[1], fit.Largest[0])
		}
	}
}

// TestFitGlobalBatch checks each setting that reaches a global batch:
// its micro-batch times its accumulation times the GPUs is the global
// batch, it fits, and the next micro-batch that divides a GPU's share
// does not.
func TestFitGlobalBatch(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	for _, tt := range []struct {
		gpus, global int64
		budget       mem.Bytes
	}{{1, 16, 4200 << 10}, {1, 12, 6 << 20}, {2, 16, 4 << 20}, {4, 8, 3 << 20}} {
		opt := &Options{Budget: tt.budget}
		fit, err := build.Fit(base, opt, FitOptions{GPUs: tt.gpus, GlobalBatch: tt.global})
		if err != nil {
			t.Fatal(err)
		}
		tried := map[string]bool{}
		for _, st := range fit.Settings {
			tried[st.Name] = true
			// tensor-parallel ranks and pipeline stages share their
			// data-parallel rank's sequences
			dp := tt.gpus / (max(st.Setup.Parallel.TP, 1) * max(st.Change.PP, 1))
			share := tt.global / dp
			if !st.Fits {
				if st.Shortfall == nil || fits(t, build, st.Setup, 1, base.Seq, opt) && share == 1 {
					t.Errorf("%+v: %s does not fit, and says %v", tt, st.Name, st.Shortfall)
				}
				continue
			}
			if st.MicroBatch*st.GradAccum*dp != tt.global || st.Setup.Parallel.DP != max(dp, 1) && tt.gpus > 1 {
				t.Errorf("%+v: %s: micro-batch %d × %d × %d data-parallel ranks", tt, st.Name, st.MicroBatch, st.GradAccum, dp)
				continue
			}
			s := st.Setup
			// Plain data parallelism that accumulates reduces once a
			// step, as the Hugging Face Trainer runs it; ZeRO keeps the
			// base's every micro-batch.
			if p := s.Parallel; p.NoSync != (p.DP > 1 && p.Zero == 0 && st.GradAccum > 1) {
				t.Errorf("%+v: %s: no_sync %v over %d ranks, ZeRO %d, %d micro-batches", tt, st.Name, p.NoSync, p.DP, p.Zero, st.GradAccum)
			}
			if !fitsSetting(t, build, st, s, st.MicroBatch, opt) {
				t.Errorf("%+v: %s at micro-batch %d does not fit", tt, st.Name, st.MicroBatch)
			}
			if st.PeakBytes > tt.budget || st.SpareBytes != tt.budget-st.PeakBytes {
				t.Errorf("%+v: %s: peak %v, spare %v", tt, st.Name, st.PeakBytes, st.SpareBytes)
			}
			if st.Change.PP > 1 {
				// Of the micro-batches that divide the share and fit, the
				// one whose step costs least.
				chosen := pipelineAt(t, build, st, s, st.MicroBatch, opt)
				for m := int64(1); m <= share; m++ {
					if share%m != 0 {
						continue
					}
					next := s
					next.GradAccum = share / m
					if pl := pipelineAt(t, build, st, next, m, opt); pl.Feasible && pl.Cost < chosen.Cost {
						t.Errorf("%+v: %s: micro-batch %d costs %g, less than %d's %g", tt, st.Name, m, pl.Cost, st.MicroBatch, chosen.Cost)
					}
				}
				continue
			}
			for m := st.MicroBatch + 1; m <= share; m++ {
				if share%m != 0 {
					continue
				}
				next := s
				next.GradAccum = share / m
				if fitsSetting(t, build, st, next, m, opt) {
					t.Errorf("%+v: %s: micro-batch %d fits too, beyond %d", tt, st.Name, m, st.MicroBatch)
				}
				break
			}
		}
		want := []string{"full, adamw-fused", "full, adamw8bit", "LoRA r16, adamw-fused", "QLoRA r16 (nf4), adamw-fused"}
		if tt.gpus > 1 {
			want = []string{"full, adamw-fused, DDP over %d", "full, adamw8bit, ZeRO 3 over %d", "LoRA r16, adamw-fused, ZeRO 3 over %d", "QLoRA r16 (nf4), adamw-fused, DDP over %d"}
			for i := range want {
				want[i] = fmt.Sprintf(want[i], tt.gpus)
			}
			want = append(want, fmt.Sprintf("full, adamw-fused, TP %d", tt.gpus), fmt.Sprintf("full, adamw-fused, PP %d", tt.gpus))
			if tt.gpus == 4 {
				want = append(want, "full, adamw-fused, TP 2, ZeRO 1 over 2", "full, adamw-fused, TP 2, PP 2")
			}
		}
		for _, name := range want {
			if !tried[name] {
				t.Errorf("%+v: no setting %q among %v", tt, name, tried)
			}
		}
	}
}

// TestShortfall checks a shortfall's least budget by planning at it and
// a byte below, and that its parts add up to it.
func TestShortfall(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	for _, tt := range []struct {
		budget mem.Bytes
		batch  int64
		static bool
	}{{3 << 20, 2, true}, {4200 << 10, 2, false}, {4200 << 10, 8, false}, {6 << 20, 32, false}} {
		s := base
		s.Batch = tt.batch
		p, err := build(s)
		if err != nil {
			t.Fatal(err)
		}
		sf, err := p.Shortfall(&Options{Budget: tt.budget})
		if err != nil {
			t.Fatal(err)
		}
		if sf.StaticPasses() != tt.static {
			t.Errorf("%+v: %s", tt, sf)
			continue
		}
		st := p.Costs.Static
		if tt.static {
			most := max(st.WeightsBytes, st.GradientsBytes, st.OptimizerBytes)
			if int64(sf.TermBytes) != most || sf.StaticBytes != mem.Bytes(st.Total()) {
				t.Errorf("%+v: %s; the static parts are %+v", tt, sf, st)
			}
			continue
		}
		total := sf.StaticBytes
		for i, part := range sf.Parts {
			total += part.Bytes
			if i > 0 && part.Bytes > sf.Parts[i-1].Bytes {
				t.Errorf("%+v: parts out of order: %v", tt, sf.Parts)
			}
		}
		if total != sf.NeedBytes || sf.Term != sf.Parts[0].Name {
			t.Errorf("%+v: %s: parts add up to %v", tt, sf, total)
		}
		at, err := p.Plan(&Options{Budget: sf.NeedBytes})
		if err != nil {
			t.Fatal(err)
		}
		below, err := p.Plan(&Options{Budget: sf.NeedBytes - 1})
		if err != nil {
			t.Fatal(err)
		}
		if !at.Feasible || below.Feasible || at.Peak.At != sf.At {
			t.Errorf("%+v: %s; at it the plan fits: %v, peaking in the %s; a byte below: %v", tt, sf, at.Feasible, at.Peak.At, below.Feasible)
		}
	}
}

func TestModelBuilderRefusesAChain(t *testing.T) {
	src, err := graphio.Load("../graphio/testdata/chains/mlp4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ModelBuilder(src, nil); err == nil {
		t.Error("a profiled chain has a builder")
	}
}

// TestLargestDivisor checks the divisor search against counting down.
func TestLargestDivisor(t *testing.T) {
	for n := int64(1); n <= 200; n++ {
		for m := int64(1); m <= n+1; m++ {
			want := min(m, n)
			for n%want != 0 {
				want--
			}
			if got := largestDivisor(n, m); got != want {
				t.Fatalf("largestDivisor(%d, %d) = %d, want %d", n, m, got, want)
			}
		}
	}
	if got := largestDivisor(1<<30-35, 1<<30); got != 1<<30-35 {
		t.Errorf("a global batch no larger than m is its own divisor: %d", got)
	}
}

// TestFitKeepsTheBase checks the settings against the base they change:
// one GPU plans one rank whatever the base's ranks; the base's own stage
// is the least change where it fits; no micro-batch passes MaxBatch.
func TestFitKeepsTheBase(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	sharded := base
	sharded.Parallel.DP, sharded.Parallel.Zero = 4, 3
	fit, err := build.Fit(sharded, &Options{Budget: 6 << 20}, FitOptions{GPUs: 1, GlobalBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range fit.Settings {
		if p := st.Setup.Parallel; p.DP != 1 || p.Zero != 0 {
			t.Errorf("one GPU: %s plans %+v", st.Name, p)
		}
	}
	zero2 := base
	zero2.Batch, zero2.Parallel.DP, zero2.Parallel.Zero = 16, 4, 2
	fit, err = build.Fit(zero2, &Options{Budget: 4 << 20}, FitOptions{GPUs: 4, GlobalBatch: 64})
	if err != nil {
		t.Fatal(err)
	}
	if fit.LeastChange < 0 || fit.Settings[fit.LeastChange].Name != "full, adamw-fused, ZeRO 2 over 4" {
		t.Errorf("least change %d of %+v", fit.LeastChange, fit.Settings)
	}
	fit, err = build.Fit(base, &Options{Budget: 6 << 20}, FitOptions{GlobalBatch: 64, MaxBatch: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range fit.Settings {
		if st.MicroBatch > 3 || st.Fits && st.MicroBatch*st.GradAccum != 64 {
			t.Errorf("--max-batch 3: %s at %d × %d", st.Name, st.MicroBatch, st.GradAccum)
		}
	}
}

// TestFitFromTensorParallelism: from a base that splits over tensor
// parallelism, fit tries the other degrees and none at all.
func TestFitFromTensorParallelism(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	base.Parallel.TP = 2
	fit, err := build.Fit(base, &Options{Budget: 6 << 20}, FitOptions{GPUs: 4, GlobalBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	tps := map[int64]bool{}
	for _, st := range fit.Settings {
		tps[st.Setup.Parallel.TP] = true
		if st.Setup.Parallel.DP*st.Setup.Parallel.TP*max(st.Change.PP, 1) != 4 {
			t.Errorf("%s: TP %d × DP %d over 4 GPUs", st.Name, st.Setup.Parallel.TP, st.Setup.Parallel.DP)
		}
	}
	if !tps[1] || !tps[2] || !tps[4] {
		t.Errorf("tensor-parallel degrees tried: %v, want 1, 2 and 4", tps)
	}
}

// TestFitPipelineShortfall: a pipeline setting that does not fit names
// the least budget its plan needs, which a pipeline plan fits at and not
// a byte below, or the static memory that passes the budget alone.
func TestFitPipelineShortfall(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	for _, budget := range []mem.Bytes{1 << 20, 2 << 20, 2200 << 10} {
		opt := &Options{Budget: budget}
		fit, err := build.Fit(base, opt, FitOptions{GPUs: 2, GlobalBatch: 8})
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for _, st := range fit.Settings {
			if st.Change.PP <= 1 || st.Fits {
				continue
			}
			seen = true
			sf := st.Shortfall
			s := st.Setup
			s.Batch, s.GradAccum = 1, 8/s.Parallel.DP
			if sf.StaticPasses() {
				if sf.StaticBytes < budget || sf.TermBytes == 0 {
					t.Errorf("%v: %s: static %v passes %v, most of it %s %v", budget, st.Name, sf.StaticBytes, budget, sf.Term, sf.TermBytes)
				}
				continue
			}
			at := func(b mem.Bytes) bool { return fitsSetting(t, build, st, s, 1, &Options{Budget: b}) }
			if !at(sf.NeedBytes) || at(sf.NeedBytes-1) {
				t.Errorf("%v: %s needs %v: fits there %v, a byte below %v", budget, st.Name, sf.NeedBytes, at(sf.NeedBytes), at(sf.NeedBytes-1))
			}
			if sf.Term != "activations" || sf.TermBytes != sf.NeedBytes-sf.StaticBytes {
				t.Errorf("%v: %s: %s %v beyond static %v of %v", budget, st.Name, sf.Term, sf.TermBytes, sf.StaticBytes, sf.NeedBytes)
			}
		}
		if !seen {
			t.Errorf("%v: every pipeline setting fits", budget)
		}
	}
}

// TestSettingsPipelines: over N GPUs fit tries pipelines of 2, 4 and 8
// stages, each of the most tensor-parallel ranks up to 8 that N leaves
// (halving where the model does not take a degree), the rest
// data-parallel under ZeRO 1.
func TestSettingsPipelines(t *testing.T) {
	all := func(Change) bool { return true }
	noTP8 := func(c Change) bool { return c.TP != 8 }
	for _, tt := range []struct {
		gpus  int64
		valid func(Change) bool
		want  []Change
	}{
		{1, all, nil},
		{2, all, []Change{{PP: 2, TP: 1, Zero: -1}}},
		{8, all, []Change{{PP: 2, TP: 4, Zero: -1}, {PP: 4, TP: 2, Zero: -1}, {PP: 8, TP: 1, Zero: -1}}},
		{64, all, []Change{{PP: 2, TP: 8, Zero: 1}, {PP: 4, TP: 8, Zero: 1}, {PP: 8, TP: 8, Zero: -1}}},
		{64, noTP8, []Change{{PP: 2, TP: 4, Zero: 1}, {PP: 4, TP: 4, Zero: 1}, {PP: 8, TP: 4, Zero: 1}}},
		{12, all, []Change{{PP: 2, TP: 6, Zero: -1}, {PP: 4, TP: 3, Zero: -1}}},
	} {
		var got []Change
		for _, c := range settings(ir.DefaultSetup(), tt.gpus, tt.valid) {
			if c.PP > 0 {
				got = append(got, c)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%d GPUs: pipelines %+v, want %+v", tt.gpus, got, tt.want)
		}
	}
}

// TestFitPipelineUnplannable: a pipeline setting no plan can be made of
// says why: sizes past what int64 counts, or a share that needs more
// microbatches than a pipeline orders.
func TestFitPipelineUnplannable(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	base.Seq = 1 << 20
	for _, tt := range []struct {
		maxBatch int64
		want     string
	}{{0, "at micro-batch 16384 its sizes pass what int64 counts"}, {4, "need more than 65536 microbatches of at most 4"}} {
		fit, err := build.Fit(base, &Options{Budget: 1 << 50}, FitOptions{GPUs: 2, GlobalBatch: 1 << 30, MaxBatch: tt.maxBatch})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range fit.Settings {
			if st.Change.PP > 1 && (st.Fits || st.Shortfall == nil || !strings.Contains(st.Shortfall.String(), tt.want)) {
				t.Errorf("--max-batch %d: %s fits %v: %v, want %q", tt.maxBatch, st.Name, st.Fits, st.Shortfall, tt.want)
			}
		}
	}
}

// TestFitBuildsEachSetupOnce: Fit's concurrent searches share their
// problems, so no setup is built twice, and the answer is the one each
// search gets on problems of its own: a Fit over a builder that hands out
// fresh problems (the shared ones' keep sets searched or not) equals one
// through the first.
func TestFitBuildsEachSetupOnce(t *testing.T) {
	build, base := fitBuilder(t, "tiny-llama")
	var mu sync.Mutex
	builds := map[string]int{}
	counted := Builder(func(s ir.Setup) (*Problem, error) {
		mu.Lock()
		builds[fmt.Sprintf("%#v", s)]++
		mu.Unlock()
		return build(s)
	})
	opt := &Options{Budget: 4 << 20}
	fo := FitOptions{GPUs: 4, GlobalBatch: 16}
	shared, err := counted.Fit(base, opt, fo)
	if err != nil {
		t.Fatal(err)
	}
	for s, n := range builds {
		if n > 1 {
			t.Errorf("built %d times: %s", n, s)
		}
	}
	if len(builds) < 10 {
		t.Errorf("%d setups built: the fit searched almost nothing", len(builds))
	}
	// Each probe on a problem of its own.
	for i, c := range settings(base, fo.GPUs, func(Change) bool { return true }) {
		got, err := fitSetting(newSharedPlans(build), base, c, &Options{Budget: opt.Budget, Strategy: Selective}, fo.withDefaults())
		if err != nil {
			t.Fatal(err)
		}
		j := slices.IndexFunc(shared.Settings, func(sf SettingFit) bool { return sf.Change == c })
		if j < 0 {
			continue // not a valid setting: no model under it
		}
		if d := cmp.Diff(shared.Settings[j], got); d != "" {
			t.Errorf("setting %d, %s: shared (-) and its own (+):\n%s", i, c.Name(got.Setup), d)
		}
	}
}

// TestChangeKeepsReshardValid checks that a setting fit tries from a base
// planned for FSDP2 with its last layer kept gathered keeps that policy
// only where FSDP2 runs it: DDP, ZeRO 1 and 2, and pipeline stages drop
// it, so that every setting's setup is valid.
func TestChangeKeepsReshardValid(t *testing.T) {
	base := ir.DefaultSetup()
	base.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: 3, Reshard: ir.ReshardAllButLast}
	for _, tc := range []struct {
		c    Change
		want ir.Reshard
	}{
		{Change{}, ir.ReshardAllButLast},
		{Change{Zero: 3}, ir.ReshardAllButLast},
		{Change{Zero: 2}, ""},
		{Change{Zero: -1}, ""},
		{Change{PP: 2, Zero: 3}, ""},
		{Change{TP: 2, Zero: 1}, ""},
	} {
		s := tc.c.apply(base, 8)
		if s.Parallel.Reshard != tc.want {
			t.Errorf("%+v: reshard %q, want %q", tc.c, s.Parallel.Reshard, tc.want)
		}
		if err := s.Validate("training"); err != nil {
			t.Errorf("%+v: %v", tc.c, err)
		}
	}
}
