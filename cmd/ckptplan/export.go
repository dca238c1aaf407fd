package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/export"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/models"
	"github.com/ckptplan/ckptplan/planner"
)

func runExport(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("export", "MODEL|PLAN.json", stderr)
	pf := addPlanFlags(fs, true)
	to := &formatFlag{valid: export.Names()}
	fs.Var(to, "to", "what to write: "+export.Help())
	out := fs.String("o", "", "write to this file instead of standard output")
	pipe := addPipelineFlags(fs)
	arg, err := oneArg(fs, args, "MODEL or PLAN.json")
	if err != nil {
		return err
	}
	if to.value == "" {
		fs.Usage()
		names := export.Names()
		return usagef("export: need --to %s or %s", strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
	}
	pp, err := pipe.pipeline(fs)
	if err != nil {
		return err
	}
	if pp != nil {
		if to.value != "megatron" {
			return usagef("export --pp writes Megatron-LM's pipeline flags: use --to megatron")
		}
		if strings.HasSuffix(arg, ".json") {
			return usagef("export --pp plans the pipeline from a model, not from a saved plan")
		}
		src, opt, err := pf.load(fs, arg)
		if err != nil {
			return err
		}
		p, err := pf.problem(src)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := exportPipelineMegatron(&buf, stderr, src, p, opt, pp); err != nil {
			return err
		}
		if *out == "" {
			_, err := stdout.Write(buf.Bytes())
			return err
		}
		return writeFile(*out, func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err })
	}
	plan, p, opt, unverified, err := exportPlan(fs, pf, arg, to.value, stderr)
	if err != nil {
		return err
	}
	if plan.Unit == planner.TimeUnit {
		// The engines' settings and the runtime's figures are FLOPs: the
		// same schedule, priced so.
		if p == nil {
			return fmt.Errorf("%s: a plan priced in time is exported from its model, which is not here as it was", arg)
		}
		if p, plan, err = p.InFLOPs(plan); err != nil {
			return fmt.Errorf("%s: the plan in FLOPs: %w", arg, err)
		}
	}
	e, err := export.FromPlan(plan)
	if err != nil {
		return err
	}
	t := export.Lookup(to.value)
	var setting *export.Setting // the engine's closest setting, where it cannot run the plan
	if t.Closest != nil && opt != nil {
		if setting, err = t.Closest(e, p, opt); err != nil {
			return err
		}
		if setting != nil && setting.Plan != nil && setting.Plan.PagedOutBytes > 0 {
			e.Notes = append(e.Notes, fmt.Sprintf("the closest setting's peak holds %v of the paged optimizer's state on the host, which the driver moves there and back each step", setting.Plan.PagedOutBytes))
		}
	}
	if p != nil { // only the model can say what the plan holds layer by layer
		if rt, err := p.LayerRuntime(plan); err == nil {
			if err := e.LayerByLayer(rt); err != nil {
				return err
			}
		}
	}
	write := func(w io.Writer) error {
		notes, err := t.Write(w, e, setting, "ckptplan export "+strings.Join(args, " "))
		if err == nil && unverified != "" {
			notes = append(notes, unverified)
		}
		for _, n := range notes {
			fmt.Fprintf(stderr, "ckptplan: note: %s\n", n)
		}
		return err
	}
	if *out == "" {
		// Write nothing on error: the Megatron export may refuse a plan.
		var buf bytes.Buffer
		if err := write(&buf); err != nil {
			return err
		}
		_, err := stdout.Write(buf.Bytes())
		return err
	}
	return writeFile(*out, write)
}

// checkSharder refuses a plan under ZeRO whose figures are for another
// engine than the one the export target configures.
func checkSharder(p ir.Parallel, profile ir.Profile, target string) error {
	engine := export.Lookup(target).Sharder
	if engine == "" || p.Zero == 0 || profile == costmodel.Megatron {
		return nil
	}
	if engine == ir.ShardingFSDP2 && p.Zero < 3 {
		return usagef("export --to %s shards with fully_shard, ZeRO 3, but the plan is for ZeRO %d: plan with --zero 3", target, p.Zero)
	}
	if got := p.Sharder(); got != engine {
		var others []string
		for _, t := range export.Targets {
			if t.Sharder == got {
				others = append(others, t.Name)
			}
		}
		return usagef("export --to %s runs ZeRO %d on %s, but the plan is for %s: plan with --sharding %s, or export to %s", target, p.Zero, engine, got, engine, strings.Join(others, " or "))
	}
	return nil
}

// exportPlan reads a saved JSON plan, or plans MODEL with the flags; it
// returns the problem too when it planned one. Under ZeRO, the plan is
// for the engine the target configures: a model's unset sharding is
// that engine, and another is refused.
func exportPlan(fs *flag.FlagSet, pf *planFlags, arg, target string, stderr io.Writer) (plan *planner.Plan, p *planner.Problem, opt *planner.Options, unverified string, err error) {
	if strings.HasSuffix(arg, ".json") {
		data, err := graphio.ReadInput(arg)
		if err != nil {
			return nil, nil, nil, "", err
		}
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(data, &probe); err != nil {
			_, err := graphio.Parse(arg, data) // names the line and column
			return nil, nil, nil, "", err
		}
		if probe["schedule"] != nil && probe["schema"] != nil {
			plan, p, unverified, err := readPlanFile(fs, arg, data, target)
			return plan, p, nil, unverified, err
		}
	}
	plan, p, opt, err = planModelFlags(fs, pf, arg, target, stderr)
	return plan, p, opt, "", err
}

// planModelFlags plans MODEL with the flags for the target.
func planModelFlags(fs *flag.FlagSet, pf *planFlags, arg, target string, stderr io.Writer) (*planner.Plan, *planner.Problem, *planner.Options, error) {
	src, opt, err := pf.load(fs, arg)
	if err != nil {
		return nil, nil, nil, err
	}
	if src.Kind == graphio.KindModel {
		t := &src.Model.Training
		if e := export.Lookup(target).Sharder; t.Parallel.Sharding == "" && t.Parallel.Zero > 0 && (e == ir.ShardingDeepSpeed || t.Parallel.Zero >= 3) {
			t.Parallel.Sharding = e
		}
		if err := checkSharder(t.Parallel, t.Profile, target); err != nil {
			return nil, nil, nil, err
		}
	}
	p, err := pf.problem(src)
	if err != nil {
		return nil, nil, nil, err
	}
	plan, err := p.Plan(opt)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, n := range plan.Notes {
		fmt.Fprintf(stderr, "ckptplan: note: %s\n", n)
	}
	if !plan.Feasible {
		return nil, nil, nil, infeasible(src, p, opt, plan)
	}
	return plan, p, opt, nil
}

// readPlanFile reads a saved plan and verifies it: the flags that would
// change it are refused (they are the plan's), its fields must not
// repeat or contradict one another (planner.Plan.Check), and where its
// model is found as it was (planSource), its schedule is planned again on
// the model under the plan's setup and every figure must be the model's
// (planner.Problem.Verify); the problem is returned then. A plan whose
// model file is not found unchanged is checked against itself only,
// which unverified says, for a note. Under ZeRO, the plan
// must be for the engine the target configures.
func readPlanFile(fs *flag.FlagSet, arg string, data []byte, target string) (plan *planner.Plan, p *planner.Problem, unverified string, err error) {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "to" && f.Name != "o" {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) > 0 {
		return nil, nil, "", usagef("export %s: %s set what a saved plan already says: export from the model with them, or give only --to and -o", arg, strings.Join(given, ", "))
	}
	if err := graphio.CheckJSONKeys(arg, data); err != nil {
		return nil, nil, "", err
	}
	if plan, err = planner.ReadPlan(bytes.NewReader(data)); err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", arg, err)
	}
	if err := plan.Check(); err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", arg, err)
	}
	if s := plan.Setup; s != nil {
		if err := checkSharder(s.Parallel, s.Profile, target); err != nil {
			return nil, nil, "", err
		}
	}
	src, err := planSource(plan, filepath.Dir(arg))
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", arg, err)
	}
	if src == nil {
		return plan, nil, fmt.Sprintf("%s: the model file it was planned from (%q) is not here as it was, so its figures were checked against one another, not against the model", arg, plan.SourceFile), nil
	}
	if p, err = planModel(plan, src); err == nil {
		err = p.Verify(plan)
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", arg, err)
	}
	return plan, p, "", nil
}

// planSource finds the model a plan was made from: a bundled model by
// its name, or the file it records, as a path from the current directory
// or from the plan's (dir), whose bytes still have the recorded SHA-256.
// It returns nil for a file that is not found so; an error for a bundled
// model that does not load.
func planSource(plan *planner.Plan, dir string) (*graphio.Source, error) {
	if _, ok := models.Read(plan.Model); ok && plan.SourceFile == "" {
		return graphio.Load(plan.Model)
	}
	if plan.SourceFile == "" || plan.SourceSHA256 == "" {
		return nil, nil
	}
	for _, path := range []string{plan.SourceFile, filepath.Join(dir, plan.SourceFile)} {
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() && !fi.IsDir() {
			continue
		}
		src, err := graphio.Load(path)
		if err == nil && src.SHA256 == plan.SourceSHA256 {
			return src, nil
		}
	}
	return nil, nil
}

// planModel rebuilds the problem of a plan from its source, under the
// setup the plan records.
func planModel(plan *planner.Plan, src *graphio.Source) (*planner.Problem, error) {
	if src.Kind == graphio.KindModel {
		if plan.Setup == nil {
			return nil, fmt.Errorf("the plan of %s records no setup", plan.Model)
		}
		src.Model.Training = *plan.Setup
	}
	return planner.NewTimed(src, plan.Roofline)
}
