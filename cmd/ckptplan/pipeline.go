package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/export"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
)

// pipelineFlags are plan's pipeline parallel flags.
type pipelineFlags struct {
	stages, microbatches, virtual int
	schedule, layers              string
}

func addPipelineFlags(fs *flag.FlagSet) *pipelineFlags {
	p := &pipelineFlags{}
	fs.IntVar(&p.stages, "pp", 0, "pipeline parallel stages: plan every device of the pipeline")
	fs.IntVar(&p.microbatches, "microbatches", 0, "microbatches a step under --pp, each of --batch (default: --pp)")
	fs.StringVar(&p.schedule, "pp-schedule", "1f1b", "pipeline schedule: "+strings.Join(planner.PipelineSchedules, " | "))
	fs.IntVar(&p.virtual, "virtual-stages", 0, "model chunks a device under --pp-schedule interleaved")
	fs.StringVar(&p.layers, "pp-layers", "", "decoder layers of each pipeline chunk, comma-separated (default: as even as can be)")
	return p
}

// pipeline returns the pipeline the flags ask for, or nil without --pp.
func (p *pipelineFlags) pipeline(fs *flag.FlagSet) (*planner.Pipeline, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["pp"] {
		for _, name := range []string{"microbatches", "pp-schedule", "virtual-stages", "pp-layers"} {
			if given[name] {
				return nil, usagef("--%s needs --pp", name)
			}
		}
		return nil, nil
	}
	if p.stages < 1 {
		return nil, usagef("--pp must be positive, got %d", p.stages)
	}
	if !slices.Contains(planner.PipelineSchedules, p.schedule) {
		return nil, usagef("--pp-schedule: unknown value %q (valid: %s)", p.schedule, strings.Join(planner.PipelineSchedules, ", "))
	}
	pp := &planner.Pipeline{Stages: p.stages, Microbatches: p.microbatches, Schedule: p.schedule, Virtual: p.virtual}
	if !given["microbatches"] {
		pp.Microbatches = p.stages
	} else if p.microbatches < 1 {
		return nil, usagef("--microbatches must be positive, got %d", p.microbatches)
	}
	if given["virtual-stages"] && p.virtual < 1 {
		return nil, usagef("--virtual-stages must be positive, got %d", p.virtual)
	}
	if p.layers != "" {
		for _, f := range strings.Split(p.layers, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return nil, usagef("--pp-layers: %q is not a positive layer count", f)
			}
			pp.Layers = append(pp.Layers, n)
		}
	}
	return pp, nil
}

// runPipeline plans every device of a pipeline and writes the plan.
func runPipeline(stdout, stderr io.Writer, src *graphio.Source, p *planner.Problem, opt *planner.Options, pp *planner.Pipeline, format string) error {
	plan, err := p.PlanPipeline(opt, *pp)
	if err != nil {
		return err
	}
	for _, n := range plan.Notes {
		fmt.Fprintf(stderr, "ckptplan: note: %s\n", n)
	}
	if err := writeFormatted(stdout, format, plan, func(w io.Writer) error { return writePipelineText(w, plan) }); err != nil {
		return err
	}
	if !plan.Feasible {
		return pipelineInfeasible(src, p, opt, plan)
	}
	return nil
}

// pipelineInfeasible says which devices do not fit and why: static
// memory alone, and its largest part, or the least budget each needs;
// then the least change that fits, as fit finds it over the same GPUs
// for the same sequences a step, or the settings that hold less.
func pipelineInfeasible(src *graphio.Source, prob *planner.Problem, opt *planner.Options, p *planner.PipelinePlan) error {
	var too []string
	var least int64   // the budget every stage fits in
	reachable := true // every stage fits in some budget
	static := false   // a stage's static memory alone passes the budget
	for _, d := range p.Devices {
		if d.Feasible {
			continue
		}
		need := fmt.Sprintf("static memory alone is %v", d.StaticBytes)
		if d.MinBudgetBytes > 0 {
			need = fmt.Sprintf("it needs at least %v, static memory %v of it", d.MinBudgetBytes, d.StaticBytes)
			least = max(least, int64(d.MinBudgetBytes))
		} else {
			reachable = false
		}
		if d.StaticBytes+p.ReserveBytes >= p.BudgetBytes {
			static = true
			if d.Static != nil {
				term, bytes := d.Static.Largest()
				all := ""
				if d.MinBudgetBytes > 0 {
					all = fmt.Sprintf(", at least %v in all", d.MinBudgetBytes)
				}
				need = fmt.Sprintf("static memory %v passes the budget alone, most of it %s (%v)%s", d.StaticBytes, term, mem.Bytes(bytes), all)
			}
		}
		too = append(too, fmt.Sprintf("stage %d (%s)", d.Rank, need))
	}
	reserve := ""
	if p.ReserveBytes > 0 {
		reserve = fmt.Sprintf(", %v of it reserved for what is not a tensor (--reserve)", p.ReserveBytes)
	}
	hint := "; fewer microbatches in flight (a smaller --batch or --seq) hold less"
	if static {
		hint = "; more pipeline stages (--pp) hold less"
		if p.Setup != nil {
			hint = staticHints(p.Setup, "more pipeline stages (--pp)")
		}
	}
	if p.Setup != nil && src.Kind == graphio.KindModel {
		if change := fitsInstead(src, prob, opt, *p.Setup, &p.Pipeline); change != "" {
			hint = change
		}
	}
	err := &infeasibleError{msg: fmt.Sprintf("%s does not fit in %v a device%s with the %s solver on %d pipeline stages: %s%s", p.Model, p.BudgetBytes, reserve, p.Solver, p.Pipeline.Stages, strings.Join(too, "; "), hint)}
	if reachable {
		err.minBudgetBytes = least
	}
	return err
}

func writePipelineText(w io.Writer, p *planner.PipelinePlan) error {
	pp := p.Pipeline
	sched := "1F1B"
	if pp.Schedule == "interleaved" {
		sched = fmt.Sprintf("interleaved, %d chunks a device", pp.Virtual)
	}
	batch := ""
	if s := p.Setup; s != nil {
		batch = fmt.Sprintf(" of batch %d", s.Batch)
	}
	fmt.Fprintf(w, "%s on %d pipeline stages (%s, %d microbatches%s) with the %s solver in %v a device",
		p.Model, pp.Stages, sched, pp.Microbatches, batch, p.Solver, p.BudgetBytes)
	if p.Feasible {
		fmt.Fprintf(w, ": largest peak %v", p.PeakBytes)
	}
	fmt.Fprintf(w, " + reserve %v\n", p.ReserveBytes)
	if s := p.Setup; s != nil {
		fmt.Fprintf(w, "assumes batch %d, sequence %d, %s, %s attention, %s profile\n", s.Batch, s.Seq, precision(s.DType, s.Autocast), s.Attention, profileName(s.Profile, s.Transformers))
	}
	switch {
	case p.Feasible && p.Unit == planner.TimeUnit:
		comm := ""
		if p.CommCost > 0 {
			comm = ", and data-parallel collectives not hidden, " + costString(p.CommCost, p.Unit) + " with the all-gather after the step"
		}
		tied := ","
		if p.TiedCost > 0 {
			tied = ", the all-reduce of the tied weights' gradients between the two stages holding them, " + costString(p.TiedCost, p.Unit) + ","
		}
		fmt.Fprintf(w, "step %s, store-everything %s: %.1f%% extra time (the schedule's, its bubble and sends included%s then the slowest stage's optimizer step, %s%s)\n",
			costString(p.Cost, p.Unit), costString(p.BaselineCost, p.Unit), 100*p.Overhead, tied, costString(p.UpdateCost, p.Unit), comm)
	case p.Feasible:
		fmt.Fprintf(w, "cost %s, store-everything %s: %.1f%% extra %s\n", costString(p.Cost, p.Unit), costString(p.BaselineCost, p.Unit), 100*p.Overhead, extra(p.Unit))
	}
	fmt.Fprintln(w)
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "stage\truns\tin flight\theld a microbatch\tstatic\tactivations\tpeak\textra\tdecisions")
	for _, d := range p.Devices {
		var runs, flight, held []string
		for _, c := range d.Chunks {
			runs = append(runs, stageRange(c.Stages))
			flight = append(flight, strconv.Itoa(c.InFlight))
			held = append(held, c.HeldBytes.String())
		}
		if !d.Feasible {
			need := "does not fit"
			if d.MinBudgetBytes > 0 {
				need = "needs " + d.MinBudgetBytes.String()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t\t%v\t\t%s\t\t\n", d.Rank, strings.Join(runs, " + "), strings.Join(flight, " + "), d.StaticBytes, need)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%v\t%v\t%.1f%%\t%s\n", d.Rank, strings.Join(runs, " + "), strings.Join(flight, " + "),
			strings.Join(held, " + "), d.StaticBytes, d.ActivationPeakBytes, d.PeakBytes, 100*d.Overhead, decisions(d.Chunks))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, trimCells(table.String())); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nin flight: the most microbatches a stage holds at once; held: what each keeps from its forward to its backward\n")
	if p.Unit == planner.TimeUnit {
		fmt.Fprintf(w, "extra: of the stage's own forwards and backwards, without the time it waits\n")
	}
	if p.Feasible && len(p.Devices) > 0 {
		if st := p.Devices[0].Static; st != nil && p.Setup != nil {
			fmt.Fprintf(w, "static of stage 0: %s\n", staticParts(p.Setup, st))
			if st.CallArgs > 0 { // in each chunk's input (planner.Chunk.InputBytes)
				fmt.Fprintf(w, "each microbatch holds the positions and masks its layers' calls take, %v, to its backward\n", mem.Bytes(st.CallArgs))
			}
		}
	}
	return nil
}

// stageRange names a run of stages by its first and last: "embed …
// layers.11".
func stageRange(stages []planner.Stage) string {
	if len(stages) == 1 {
		return stages[0].Name
	}
	return stages[0].Name + " … " + stages[len(stages)-1].Name
}

// decisions counts a device's stages by what their first forward does:
// "store 1, megatron-selective 12, checkpoint 2".
func decisions(chunks []planner.Chunk) string {
	var order []string
	count := map[string]int{}
	for _, c := range chunks {
		for _, s := range c.Stages {
			d := s.Decision.String()
			if s.Option != "" {
				d = s.Option
			}
			if count[d] == 0 {
				order = append(order, d)
			}
			count[d]++
		}
	}
	var out []string
	for _, d := range order {
		out = append(out, fmt.Sprintf("%s %d", d, count[d]))
	}
	return strings.Join(out, ", ")
}

// trimCells drops the spaces tabwriter leaves after a row's last cell.
func trimCells(s string) string {
	var out strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		out.WriteString(strings.TrimRight(line, " \n") + strings.Repeat("\n", strings.Count(line, "\n")))
	}
	return out.String()
}

// exportPipelineMegatron writes the Megatron-LM flags of a pipeline plan
// (export.MegatronPipeline).
func exportPipelineMegatron(w, stderr io.Writer, src *graphio.Source, p *planner.Problem, opt *planner.Options, pp *planner.Pipeline) error {
	m, err := p.PlanPipelineForMegatron(opt, *pp)
	if err != nil {
		return err
	}
	for _, n := range m.Plan.Notes {
		fmt.Fprintf(stderr, "ckptplan: note: %s\n", n)
	}
	if !m.Plan.Feasible {
		return pipelineInfeasible(src, p, opt, m.Plan)
	}
	return export.MegatronPipeline(w, m)
}
