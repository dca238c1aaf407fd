package main

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/planner"
)

func runFit(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("fit", "MODEL", stderr)
	pf := addPlanFlags(fs, true)
	gpus := fs.Int64("gpus", 0, "GPUs the settings train over: data-parallel ranks, plain or sharded by ZeRO, times tensor-parallel and pipeline ranks (default: the model's --tp × --dp)")
	global := fs.Int64("global-batch", 0, "sequences a step trains on over every GPU, which each setting reaches by micro-batch and gradient accumulation (default: each setting's largest micro-batch)")
	multiple := fs.Int64("seq-multiple", 64, "the longest sequence is searched in multiples of this")
	maxBatch := fs.Int64("max-batch", 1<<16, "the largest micro-batch searched")
	maxSeq := fs.Int64("max-seq", 1<<20, "the longest sequence searched (and a GPT-2 model's max_seq)")
	format := addFormat(fs, "text", "json", "yaml")
	src, opt, err := pf.parse(fs, args)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"gpus", *gpus}, {"global-batch", *global}, {"seq-multiple", *multiple}, {"max-batch", *maxBatch}, {"max-seq", *maxSeq}} {
		if f.v < 0 || f.v == 0 && f.name != "gpus" && f.name != "global-batch" {
			return usagef("--%s must be positive, got %d", f.name, f.v)
		}
	}
	if *global > planner.MaxGlobalBatch || *gpus > planner.MaxGlobalBatch {
		return usagef("--global-batch and --gpus are at most %d", planner.MaxGlobalBatch)
	}
	build, err := planner.ModelBuilder(src, pf.timing)
	if err != nil {
		return usagef("%v", err)
	}
	base := src.Model.Training
	if m := src.Model; m.Family == "gpt2" && m.MaxSeq > 0 {
		*maxSeq = min(*maxSeq, m.MaxSeq) // the positions it learns
	}
	if *multiple > *maxSeq {
		return usagef("--seq-multiple %d is longer than the longest sequence searched, %d (--max-seq, or a GPT-2 model's max_seq)", *multiple, *maxSeq)
	}
	n := *gpus
	if n == 0 {
		n = max(base.Parallel.TP, 1) * max(base.Parallel.DP, 1)
	}
	if *global > 0 && *global%n != 0 {
		return usagef("--global-batch %d does not divide over %d GPUs", *global, n)
	}
	fit, err := build.Fit(base, opt, planner.FitOptions{GPUs: n, GlobalBatch: *global, SeqMultiple: *multiple, MaxBatch: *maxBatch, MaxSeq: *maxSeq})
	if err != nil {
		return err
	}
	return writeFormatted(stdout, format.value, fit, func(w io.Writer) error { return writeFitText(w, fit) })
}

func writeFitText(w io.Writer, f *planner.Fit) error {
	s := f.Setup
	on := f.BudgetBytes.String()
	if f.Device != "" {
		on = f.Device + ", " + on
	}
	fmt.Fprintf(w, "%s in %s a GPU, %v of it reserved for what is not a tensor\n", f.Model, on, f.ReserveBytes)
	fmt.Fprintf(w, "assumes %s, %s attention, %s profile, %s%s\n\n", precision(s.DType, s.Autocast), s.Attention, profileName(s.Profile, s.Transformers), costmodel.OptimizerName(s.Optimizer), loraString(&s))

	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 8, 2, ' ', 0)
	x := "extra " + extra(f.Unit)
	fmt.Fprintf(tw, "solver\tlargest micro-batch at sequence %d\tpeak\t%s\tlongest sequence at micro-batch 1\tpeak\t%s\n", s.Seq, x, x)
	for _, r := range f.Largest {
		seq := reachCells(r.Seq, r.SeqMax, r.SeqPeakBytes.String(), r.SeqOverhead)
		if r.Seq == 0 && r.Batch > 0 {
			seq = fmt.Sprintf("under %d\t\t", f.SeqMultiple)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Solver, reachCells(r.Batch, r.BatchMax, r.BatchPeakBytes.String(), r.BatchOverhead), seq)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, trimCells(table.String())); err != nil {
		return err
	}

	table.Reset()
	gpus := "one GPU"
	if f.GPUs > 1 {
		gpus = fmt.Sprintf("%d GPUs", f.GPUs)
	}
	if f.GlobalBatch > 0 {
		fmt.Fprintf(w, "\nsettings that reach a global batch of %d sequences of %d tokens over %s, least %s a sequence first:\n", f.GlobalBatch, s.Seq, gpus, extra(f.Unit))
	} else {
		fmt.Fprintf(w, "\nsettings at their largest micro-batch of sequences of %d tokens over %s, least %s a sequence first:\n", s.Seq, gpus, extra(f.Unit))
	}
	tw = tabwriter.NewWriter(&table, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "setting\tmicro-batch\tgrad-accum\tpeak\tspare\t%s\t%s a sequence\tflags\n", x, extra(f.Unit))
	for _, st := range f.Settings {
		if !st.Fits {
			fmt.Fprintf(tw, "%s\tdoes not fit: %s\n", st.Name, st.Shortfall)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%v\t%.1f%%\t%s\t%s\n", st.Name, st.MicroBatch, st.GradAccum, st.PeakBytes, st.SpareBytes,
			100*st.Overhead, costString(st.CostPerSequence, f.Unit), strings.Join(settingFlags(f.Setup, st, f.Solver), " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, trimCells(table.String())); err != nil {
		return err
	}
	if f.LeastChange < 0 {
		fmt.Fprintf(w, "\nnothing tried fits: a GPU with more memory, more GPUs (--gpus) or a shorter --seq\n")
		return nil
	}
	least := f.Settings[f.LeastChange]
	fmt.Fprintf(w, "\nleast change that fits: %s\n", describeChange(f.Setup, least, f.Solver, f.Unit))
	return nil
}

// reachCells are a Reach's three cells for one size.
func reachCells(n int64, atMax bool, peak string, overhead float64) string {
	if n == 0 {
		return "does not fit\t\t"
	}
	size := strconv.FormatInt(n, 10)
	if atMax {
		size += " (the search's bound)" // --max-batch, --max-seq, or what int64 counts
	}
	return fmt.Sprintf("%s\t%s\t%.1f%%", size, peak, 100*overhead)
}

// settingFlags are the plan flags that select a setting over base, its
// micro-batch and accumulation included, and the solver that plans it
// where it is not solver, the one the flags are given with.
func settingFlags(base ir.Setup, st planner.SettingFit, solver string) []string {
	s := st.Setup
	var out []string
	if s.LoRA.Rank != base.LoRA.Rank {
		out = append(out, "--lora-rank", strconv.FormatInt(s.LoRA.Rank, 10))
	}
	if s.Quant != base.Quant {
		out = append(out, "--quant", string(s.Quant))
		if s.DoubleQuant {
			out = append(out, "--double-quant")
		}
	}
	if s.Optimizer != base.Optimizer {
		out = append(out, "--optimizer", string(s.Optimizer))
	}
	if s.Parallel.TP != max(base.Parallel.TP, 1) {
		out = append(out, "--tp", strconv.FormatInt(s.Parallel.TP, 10))
	}
	if s.Parallel.SP != base.Parallel.SP {
		out = append(out, "--sp="+strconv.FormatBool(s.Parallel.SP))
	}
	if s.Parallel.DP != max(base.Parallel.DP, 1) {
		out = append(out, "--dp", strconv.FormatInt(s.Parallel.DP, 10))
	}
	if s.Parallel.Zero != base.Parallel.Zero {
		out = append(out, "--zero", strconv.FormatInt(s.Parallel.Zero, 10))
	}
	switch {
	case s.Parallel.NoSync && !base.Parallel.NoSync:
		out = append(out, "--no-sync")
	case !s.Parallel.NoSync && base.Parallel.NoSync:
		out = append(out, "--no-sync=false")
	}
	if s.Batch != base.Batch {
		out = append(out, "--batch", strconv.FormatInt(s.Batch, 10))
	}
	if pp := st.Change.PP; pp > 1 {
		// The pipeline's microbatches are its accumulation.
		out = append(out, "--pp", strconv.FormatInt(pp, 10), "--microbatches", strconv.FormatInt(st.GradAccum, 10))
		if st.Solver != "" && st.Solver != solver {
			out = append(out, "--solver", st.Solver)
		}
		return out
	}
	if max(s.GradAccum, 1) != max(base.GradAccum, 1) {
		out = append(out, "--grad-accum", strconv.FormatInt(s.GradAccum, 10))
	}
	return out
}

// describeChange says a setting as the change from base that selects it:
// "--batch 2 --grad-accum 4 (full, adamw; peak 70.10 GiB, 12.3% extra
// compute)".
func describeChange(base ir.Setup, st planner.SettingFit, solver, unit string) string {
	flags := strings.Join(settingFlags(base, st, solver), " ")
	if flags == "" {
		flags = "none"
	}
	return fmt.Sprintf("%s (%s: micro-batch %d, %d a step; peak %v, %.1f%% extra %s)", flags, st.Name, st.MicroBatch, st.GradAccum, st.PeakBytes, 100*st.Overhead, extra(unit))
}
