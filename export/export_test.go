package export

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

// grouped is the schedule in which stage k runs as d[k] says: ≥ 0 stores
// it with that keep set, "ck" (−1) checkpoints it, "n" (−2) runs it
// keeping nothing after the previous checkpoint; each checkpointed group
// is recomputed once, storing everything, before its backward.
func grouped(d []int) solver.Schedule {
	var s solver.Schedule
	for k, o := range d {
		switch {
		case o == ck:
			s = append(s, solver.Op{Kind: solver.FCk, Stage: k})
		case o == n:
			s = append(s, solver.Op{Kind: solver.FN, Stage: k})
		default:
			s = append(s, solver.Op{Kind: solver.FAll, Stage: k, Option: o})
		}
	}
	s = append(s, solver.Op{Kind: solver.Loss, Stage: len(d)})
	for i := len(d) - 1; i >= 0; {
		if d[i] >= 0 {
			s = append(s, solver.Op{Kind: solver.B, Stage: i})
			i--
			continue
		}
		g := i
		for d[g] != ck {
			g--
		}
		for k := g; k <= i; k++ {
			s = append(s, solver.Op{Kind: solver.FAll, Stage: k})
		}
		for k := i; k >= g; k-- {
			s = append(s, solver.Op{Kind: solver.B, Stage: k})
		}
		i = g - 1
	}
	return s
}

const (
	ck = -1
	n  = -2
)

func tinyLlama(t *testing.T) *planner.Problem {
	t.Helper()
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	p.SearchKeepSets()
	return p
}

func exportOf(t *testing.T, p *planner.Problem, d []int) *Export {
	t.Helper()
	plan, err := p.PlanSchedule("hand", 0, grouped(d))
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromPlan(plan)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// option returns the index of stage 1's keep set of that name.
func option(t *testing.T, p *planner.Problem, name string) int {
	for k, o := range p.Stages[1].KeepSets {
		if o.Name == name {
			return k
		}
	}
	t.Fatalf("no keep set %s", name)
	return 0
}

// firstFrontKeepSet returns the index of stage 1's first keep set that is
// no named policy: a point of the Pareto front.
func firstFrontKeepSet(t *testing.T, p *planner.Problem) int {
	for k, o := range p.Stages[1].KeepSets {
		if !slices.Contains(stage.Policies, o.Name) {
			return k
		}
	}
	t.Fatal("no keep set besides the policies")
	return 0
}

// TestMegatron checks the flags for the plans Megatron-LM can run and the
// refusal for one it cannot, on tiny-llama's four layers (stages 1–4).
func TestMegatron(t *testing.T) {
	p := tinyLlama(t)
	ms := option(t, p, "megatron-selective")
	p1 := firstFrontKeepSet(t, p)
	tests := []struct {
		name string
		d    []int // embed, layers.0–3, head
		want string
	}{
		{"store", []int{0, 0, 0, 0, 0, 0}, "# (no flags: the plan stores every layer"},
		{"selective", []int{0, ms, ms, ms, ms, 0}, "--recompute-granularity selective\n"},
		{"block", []int{0, ck, ck, 0, 0, 0}, "--recompute-granularity full --recompute-method block --recompute-num-layers 2\n"},
		{"uniform", []int{0, ck, n, ck, n, 0}, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2\n"},
		{"every layer", []int{0, ck, ck, ck, ck, 0}, "--recompute-method block --recompute-num-layers 4\n"},
		{"uneven groups", []int{0, ck, n, n, ck, 0}, "--recompute-method uniform --recompute-num-layers 3\n"},
		{"mixed", []int{0, ck, 0, p1, 0, 0}, "cannot be written as Megatron-LM flags"},
		{"gap", []int{0, 0, ck, 0, 0, 0}, "cannot be written as Megatron-LM flags"},
		{"groups out of step", []int{0, ck, n, ck, ck, 0}, "cannot be written as Megatron-LM flags"},
		{"group starting late", []int{0, 0, ck, n, 0, 0}, "cannot be written as Megatron-LM flags"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			got := ""
			if err := exportOf(t, p, tt.d).Megatron(&b, nil, planner.MegatronRecompute{}); err != nil {
				got = "error: " + err.Error()
			} else {
				got = b.String()
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want it to contain %q", got, tt.want)
			}
			if strings.Contains(got, "uniform") && strings.Contains(got, "keeps no input") {
				t.Errorf("uniform recomputation keeps only each group's input, yet the output says otherwise: %q", got)
			}
		})
	}
}

func TestHF(t *testing.T) {
	p := tinyLlama(t)
	ms := option(t, p, "megatron-selective")
	tests := []struct {
		name string
		d    []int
		want []string
	}{
		{"store", []int{0, 0, 0, 0, 0, 0}, []string{"leave gradient checkpointing off"}},
		{"two", []int{0, ck, 0, ck, 0, 0}, []string{"CHECKPOINTED = {0, 2}", "gradient_checkpointing_enable(", "layer.gradient_checkpointing = i in CHECKPOINTED"}},
		{"selective", []int{0, 0, ms, 0, 0, 0}, []string{"CHECKPOINTED = {1}", "Layers 1 keep part", "plan's runtime pays", "no more than the plan run layer by layer", "transformers >= 4.52"}},
		{"all", []int{0, ck, ck, ck, ck, 0}, []string{"Checkpoint every layer", "gradient_checkpointing_enable("}},
		{"nothing kept", []int{0, ck, n, 0, 0, 0}, []string{"CHECKPOINTED = {0, 1}", "keeps no input for layers.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := exportOf(t, p, tt.d).HF(&b, nil); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestPyTorchModule checks the module's PLAN against the plan, without
// running Python: the layers' modes, keep sets and saved lists.
func TestPyTorchModule(t *testing.T) {
	p := tinyLlama(t)
	ms := option(t, p, "megatron-selective")
	e := exportOf(t, p, []int{0, 0, ck, ms, 0, 0})
	var b bytes.Buffer
	if err := e.PyTorch(&b, "ckptplan export tiny-llama"); err != nil {
		t.Fatal(err)
	}
	src := b.String()
	start := strings.Index(src, "PLAN = json.loads(r'''")
	end := strings.Index(src, "''')")
	if start < 0 || end < start || !strings.Contains(src, "def apply_plan(") {
		t.Fatalf("module lacks PLAN or apply_plan:\n%s", src)
	}
	var back Export
	if err := json.Unmarshal([]byte(src[start+len("PLAN = json.loads(r'''"):end]), &back); err != nil {
		t.Fatal(err)
	}
	modes := []string{}
	for _, l := range back.Layers {
		modes = append(modes, l.Mode.String()+":"+l.Policy)
	}
	if got := strings.Join(modes, " "); got != "store: checkpoint: selective:megatron-selective store:" {
		t.Errorf("modes %s", got)
	}
	sel := back.Layers[2]
	var kept, dropped mem.Bytes
	for _, s := range sel.Saved {
		if s.Keep {
			kept += s.Bytes
		} else {
			dropped += s.Bytes
		}
	}
	// The softmax probabilities (b·a·s² fp32 = 2·4·32·32·4 bytes) go; the
	// rest stays, with the 16 KiB output the tape adds.
	if dropped != 32768 || kept+16384 != sel.KeptBytes {
		t.Errorf("selective layer drops %d bytes and keeps %d (+16 KiB output), plan keeps %d", dropped, kept, sel.KeptBytes)
	}
	if len(sel.Saved) != 18 {
		t.Errorf("%d saved storages, PyTorch saves 18 in a tiny-llama layer", len(sel.Saved))
	}
}

// TestTransformersPlanSaysWhatTheRuntimePays: under the transformers
// profile, the overhead a plan prints is the one its export promises,
// which the Python package's runtime pays (python/tests measure it):
// checkpoints rerun up to their early stop, selective layers replay what
// their policy does not cache.
func TestTransformersPlanSaysWhatTheRuntimePays(t *testing.T) {
	src, err := graphio.Load("smollm-135m")
	if err != nil {
		t.Fatal(err)
	}
	src.Model.Training.Seq = 256
	p, err := planner.New(src)
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.Plan(&planner.Options{Budget: 1 << 40, Strategy: planner.Strategies[0]})
	if err != nil || !all.Feasible {
		t.Fatal(err)
	}
	least, err := p.Plan(&planner.Options{Budget: 1, Strategy: planner.Optimal})
	if err != nil || least.MinBudgetBytes == 0 {
		t.Fatal(err)
	}
	checked := 0
	for _, s := range planner.Strategies {
		for k := 1; k <= 19; k++ {
			budget := least.MinBudgetBytes + (all.PeakBytes-least.MinBudgetBytes)*mem.Bytes(k)/20
			plan, err := p.Plan(&planner.Options{Budget: budget, Strategy: s, K: 1})
			if err != nil || !plan.Feasible {
				continue
			}
			e, err := FromPlan(plan)
			if err != nil {
				t.Fatal(err)
			}
			if plan.Stages[0].Decision != "store" || plan.Stages[len(plan.Stages)-1].Decision != "store" {
				continue // trainers run embed and head plainly: the export differs, and says so
			}
			if math.Abs(e.Overhead-plan.Overhead) > 1e-12 {
				t.Errorf("%s at %v: the plan prints %+.4f%%, its runtime pays %+.4f%%", s.Name, budget, 100*plan.Overhead, 100*e.Overhead)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Errorf("only %d plans compared", checked)
	}
}

// TestTargets: every registered target has a name of its own, says what
// it writes, names an engine ZeRO can run on or none, and writes a plan
// it can run as planned (every layer stored, which each engine can say).
func TestTargets(t *testing.T) {
	p := tinyLlama(t)
	plan, err := p.Plan(&planner.Options{Budget: 1 << 30, Strategy: planner.StoreAll})
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromPlan(plan)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tt := range Targets {
		if tt.Name == "" || tt.Help == "" || tt.Write == nil || seen[tt.Name] || Lookup(tt.Name) != tt {
			t.Errorf("target %+v: want a name of its own, its help and its writer", tt)
		}
		seen[tt.Name] = true
		if tt.Sharder != "" && !slices.Contains(ir.Shardings(), tt.Sharder) {
			t.Errorf("%s: sharder %q is no engine ZeRO runs on (%v)", tt.Name, tt.Sharder, ir.Shardings())
		}
		if tt.Closest != nil {
			if s, err := tt.Closest(e, p, &planner.Options{Budget: 1 << 30, Strategy: planner.StoreAll}); s != nil || err != nil {
				t.Errorf("%s: the closest setting to storing everything is %+v (%v), want the plan itself", tt.Name, s, err)
			}
		}
		var b strings.Builder
		if _, err := tt.Write(&b, e, nil, "test"); err != nil || b.Len() == 0 {
			t.Errorf("%s: wrote %d bytes: %v", tt.Name, b.Len(), err)
		}
	}
	if Lookup("onnx") != nil {
		t.Error("Lookup found a target that is not registered")
	}
}
