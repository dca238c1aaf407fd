package export

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/solver"
)

// python is Debian's interpreter, where apt's python3-torch installs.
const python = "/usr/bin/python3"

// The CPU bytes PyTorch keeps besides a plan's tensors
// (shared/oracle/README.md): a checkpointed layer, and a selective one
// that drops something, keep the CPU RNG state for the rerun.
const rngStateBytes = 5056

// scaleScalarBytes is the float64 0-dim tensor eager attention's /√d keeps
// (shared/oracle/README.md), not an activation: the cost model leaves it
// out, autograd keeps it in every layer it does not checkpoint.
const scaleScalarBytes = 8

// TestPyTorchExport runs exported modules in PyTorch on the tiny models,
// built in plain torch after the oracle's blocks (testdata/torch), and
// checks that every layer keeps what the plan says, to the byte, and that
// the gradients equal those of the model without the plan. The plans mix
// stored, checkpointed and selective layers: the selective solver's at
// several budgets, and every keep set of a layer in turn.
func TestPyTorchExport(t *testing.T) {
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("SKIPPED: PyTorch is not available to %s (%v: %s); apt-get install python3-torch to run this test", python, err, bytes.TrimSpace(out))
	}
	for _, model := range []string{"tiny-llama", "tiny-gpt2"} {
		src, err := graphio.Load(model)
		if err != nil {
			t.Fatal(err)
		}
		p, err := planner.New(src)
		if err != nil {
			t.Fatal(err)
		}
		var plans []*planner.Plan
		all, _ := solver.Simulate(p.Chain, solver.StoreAll(p.Chain))
		least, err := p.Plan(&planner.Options{Budget: 1})
		if err != nil || least.MinBudgetBytes == 0 {
			t.Fatal(err)
		}
		low, high := least.MinBudgetBytes, max(p.Static+all.Peak, p.StepPeak)
		for _, f := range []mem.Bytes{0, 5, 10} {
			plan, err := p.Plan(&planner.Options{Budget: low + (high-low)*f/10})
			if err != nil || !plan.Feasible {
				t.Fatalf("%s at %d/10: %v", model, f, err)
			}
			plans = append(plans, plan)
		}
		// Layer k uses keep set j+k (cycling), for j = 0, 2, 4, …; then
		// the first layer checkpointed and the others stored.
		layers := p.Chain.Len() - 2
		opts := len(p.Stages[1].KeepSets)
		var hand [][]int
		for j := 0; j < opts; j += 2 {
			d := make([]int, p.Chain.Len())
			for k := 1; k <= layers; k++ {
				d[k] = (j + k - 1) % opts
			}
			hand = append(hand, d)
		}
		d := make([]int, p.Chain.Len())
		d[1] = ck
		hand = append(hand, d)
		for _, d := range hand {
			plan, err := p.PlanSchedule("hand", 0, grouped(d))
			if err != nil {
				t.Fatal(err)
			}
			plans = append(plans, plan)
		}
		modes := map[string]int{}
		for n, plan := range plans {
			e, err := FromPlan(plan)
			if err != nil {
				t.Fatal(err)
			}
			got := runCheck(t, e, model)
			if !got.GradsMatch {
				t.Errorf("%s plan %d: gradients differ from the model without the plan by up to %g", model, n, got.MaxAbsGradDiff)
			}
			if len(got.LayerKeptBytes) != len(e.Layers) {
				t.Fatalf("%s plan %d: measured %d layers, exported %d", model, n, len(got.LayerKeptBytes), len(e.Layers))
			}
			for i, l := range e.Layers {
				want := l.KeptBytes
				switch l.Mode {
				case "checkpoint":
					want += rngStateBytes
				case "store":
					want += scaleScalarBytes
				case "selective":
					want += scaleScalarBytes
					for _, s := range l.Saved {
						if !s.Keep {
							want += rngStateBytes
							break
						}
					}
				}
				modes[l.Mode.String()+" "+l.Policy]++
				if mem.Bytes(got.LayerKeptBytes[i]) != want {
					t.Errorf("%s plan %d, %s (%s %s): PyTorch keeps %d bytes, the plan %d", model, n, l.Name, l.Mode, l.Policy, got.LayerKeptBytes[i], want)
				}
			}
		}
		t.Logf("%s: %d plans, layers by mode: %v", model, len(plans), modes)
		if modes["store "] == 0 || modes["checkpoint "] == 0 || modes["selective megatron-selective"] == 0 || len(modes) < opts+1 {
			t.Errorf("%s: the plans do not cover every mode and keep set: %v", model, modes)
		}
	}
}

type checkResult struct {
	Torch          string  `json:"torch"`
	LayerKeptBytes []int64 `json:"layer_kept_bytes"`
	GradsMatch     bool    `json:"grads_match"`
	MaxAbsGradDiff float64 `json:"max_abs_grad_diff"`
}

func runCheck(t *testing.T, e *Export, model string) checkResult {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.py")
	var buf bytes.Buffer
	if err := e.PyTorch(&buf, "test"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "testdata/torch/check.py", path, "--model", model)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("check.py: %v\n%s", err, stderr.String())
	}
	var r checkResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("check.py printed %q: %v", out, err)
	}
	return r
}
