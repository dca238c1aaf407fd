package export

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/planner"
	"github.com/ckptplan/ckptplan/stage"
)

// torchtitan checkpoints layers by one setting, the [activation_checkpoint]
// table of its job config: mode "none"; "full", every layer; or
// "selective" with selective_ac_option N, a number: the N-th, 2N-th, …
// layer counted from 1 (torchtitan's _apply_ac_to_transformer_block
// counts the blocks it wraps), the others stored; or "selective" with
// selective_ac_option "op": every layer under its op-level policy, the
// keep set stage.TorchtitanOp.
type torchtitanAC struct {
	mode  string // none, full or selective
	every int    // selective: checkpoint every N-th layer
	op    bool   // selective: every layer under the op-level policy
}

func (a torchtitanAC) checkpoint(i, _ int) bool {
	switch {
	case a.mode == "full":
		return true
	case a.mode == "selective" && !a.op:
		return (i+1)%a.every == 0
	}
	return false
}

func (a torchtitanAC) option() string {
	if a.op {
		return "op"
	}
	return strconv.Itoa(a.every)
}

func (a torchtitanAC) String() string {
	if a.mode == "selective" {
		return "torchtitan selective " + a.option()
	}
	return "torchtitan " + a.mode
}

func (a torchtitanAC) toml() string {
	s := fmt.Sprintf("[activation_checkpoint]\nmode = %q\n", a.mode)
	if a.mode == "selective" {
		s += fmt.Sprintf("selective_ac_option = %q\n", a.option())
	}
	return s
}

func torchtitanSettings(n int) []torchtitanAC {
	s := []torchtitanAC{{mode: "none"}, {mode: "full"}}
	for k := 2; k <= n; k++ {
		s = append(s, torchtitanAC{mode: "selective", every: k})
	}
	return append(s, torchtitanAC{mode: "selective", op: true})
}

// TorchtitanSettings are torchtitan's settings for a model of n decoder
// layers, to plan (planner.CheapestLayers) when the plan is none of them.
func TorchtitanSettings(n int) []planner.LayerSetting {
	var out []planner.LayerSetting
	for _, a := range torchtitanSettings(n) {
		s := planner.LayerSetting{Name: a.String(), Checkpoint: a.checkpoint}
		if a.op {
			s.KeepSet = stage.TorchtitanOp
		}
		out = append(out, s)
	}
	return out
}

// torchtitanExact returns the setting that runs exactly the plan's
// layers: its checkpointed ones, each keeping its input, and the rest
// stored, or every layer under the op-level policy.
func (e *Export) torchtitanExact() (torchtitanAC, bool) {
	n := len(e.Layers)
	for _, a := range torchtitanSettings(n) {
		same := true
		for i, l := range e.Layers {
			if a.op {
				same = same && l.Mode == ModeSelective && l.Policy == stage.TorchtitanOp
				continue
			}
			ck := l.Mode == ModeCheckpoint && !e.nothing[i]
			same = same && (l.Mode == ModeStore || ck) && ck == a.checkpoint(i, n)
		}
		if same {
			return a, true
		}
	}
	return torchtitanAC{}, false
}

// TorchtitanExact reports whether one torchtitan setting runs the plan's
// layers as planned.
func (e *Export) TorchtitanExact() bool {
	_, ok := e.torchtitanExact()
	return ok
}

// The torchtitan target: its [activation_checkpoint] section, or its
// closest setting's. torchtitan shards with FSDP2.
var torchtitanTarget = &Target{Name: "torchtitan", Help: "its [activation_checkpoint] TOML", Sharder: ir.ShardingFSDP2,
	Closest: closestLayers((*Export).TorchtitanExact, TorchtitanSettings, "torchtitan", "none, full, selective every 2 to %d layers, or op"),
	Write: func(w io.Writer, e *Export, s *Setting, _ string) ([]string, error) {
		runs, at := s.closestPlan()
		return nil, e.Torchtitan(w, runs, at)
	}}

// Torchtitan writes torchtitan's [activation_checkpoint] table for the
// plan: the setting that runs its layers as planned, or else
// TorchtitanSettings' setting at, the closest, whose plan (the cheapest
// that fits) is runs, which the header compares with the plan. Without
// either it says why not and returns an error.
func (e *Export) Torchtitan(w io.Writer, runs *planner.Plan, at int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# The activation plan of %s for torchtitan, made by ckptplan", comment(e.Model))
	if e.Batch > 0 {
		fmt.Fprintf(&b, " for a local batch of %d and seq_len %d", e.Batch, e.Seq)
	}
	b.WriteString(".\n")
	a, exact := e.torchtitanExact()
	if !exact {
		if runs == nil {
			return fmt.Errorf("the plan for %s cannot be written as torchtitan's activation checkpointing: %s; export from the model (not a saved plan) for the closest setting, or plan with --solver every-k", comment(e.Model), comment(e.layerSummary()))
		}
		settings := torchtitanSettings(len(e.Layers))
		if at < 0 || at >= len(settings) {
			return fmt.Errorf("torchtitan has no setting %d", at)
		}
		a = settings[at]
		own := e.underSAC().Overhead // its keep sets' own reruns, which no setting here runs
		fmt.Fprintf(&b, "# The plan (%s solver: peak %v, %+.1f%% compute) has %s,\n", comment(e.Solver), e.PeakBytes, 100*own, comment(e.layerSummary()))
		b.WriteString("# which torchtitan's settings cannot say. The closest setting they can, and the cheapest that fits:\n")
		fmt.Fprintf(&b, "# peak %v, %+.1f%% compute.\n", runs.PeakBytes, 100*runs.Overhead)
		if math.Round(1000*runs.Overhead) < math.Round(1000*own) { // as printed
			b.WriteString("# It costs less than the plan, whose solver rounds memory up to --slots slots: more slots find it.\n")
		}
	} else {
		fmt.Fprintf(&b, "# Every layer runs as planned: peak %v, %+.1f%% compute.\n", e.PeakBytes, 100*e.Overhead)
		for _, n := range e.Notes {
			fmt.Fprintf(&b, "# Note: %s.\n", comment(n))
		}
	}
	b.WriteString(a.toml())
	_, err := io.WriteString(w, b.String())
	return err
}

// layerSummary says what the plan does with its layers, by mode: "store
// layers.0–3; selective layers.4–7".
func (e *Export) layerSummary() string {
	var order []string
	by := map[string][]int{}
	for i, l := range e.Layers {
		m := l.Mode.String()
		if l.Mode == ModeCheckpoint && e.nothing[i] {
			m = "checkpoint keeping no input"
		}
		if _, ok := by[m]; !ok {
			order = append(order, m)
		}
		by[m] = append(by[m], i)
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, m+" "+spans(by[m], "layers."))
	}
	return strings.Join(parts, "; ")
}
