package planner

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/solver"
)

// Engines that checkpoint whole layers by a setting — torchtitan's "full"
// or "every N-th layer", DeepSpeed's checkpointed layers — run a plan
// only when it is one of their settings. Otherwise the closest plan they
// can run is the cheapest of their settings that fits: each setting is
// planned as the engine runs it (a checkpointed layer keeps its input and
// reruns its forward once, right before its backward; everything else is
// stored) and replayed like any plan, so its peak and cost are exact.

// LayerSetting is a setting of such an engine: its name in the engine's
// words, and whether it checkpoints decoder layer i of n.
type LayerSetting struct {
	Name       string
	Checkpoint func(i, n int) bool
	// KeepSet names the keep set the layers not checkpointed run (a
	// runtime's policy, stage.TorchtitanOp); "": they store everything.
	KeepSet string
}

// PlanLayers plans setting s under the options' budget; the plan says
// whether it fits (Feasible) and, when not, what budget would
// (MinBudgetBytes).
func (p *Problem) PlanLayers(o *Options, s LayerSetting) (*Plan, error) {
	opt, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	n, err := p.layers()
	if err != nil {
		return nil, err
	}
	ck := make([]bool, p.Chain.Len())
	for i, name := range p.names {
		if k, ok := ir.LayerIndex(name); ok {
			ck[i] = s.Checkpoint(k, n)
		}
	}
	var opts []int
	if s.KeepSet != "" {
		var ok bool
		if opts, ok = p.policyEverywhere(s.KeepSet); !ok {
			return nil, fmt.Errorf("%s: no layer has the keep set %s", p.Name, s.KeepSet)
		}
	}
	plan, err := p.PlanSchedule(s.Name, max(opt.Budget-opt.Reserve, 1), solver.PerStage(ck, opts))
	if err != nil {
		return nil, err
	}
	plan.BudgetBytes, plan.ReserveBytes, plan.Device = opt.Budget, opt.Reserve, opt.Device
	if plan.MinBudgetBytes > 0 {
		plan.MinBudgetBytes += opt.Reserve
	}
	return plan, nil
}

// layers counts the decoder layers; it is an error when there are none.
func (p *Problem) layers() (int, error) {
	if p.Stages == nil {
		return 0, fmt.Errorf("%s is a profiled chain: it has no layers to checkpoint", p.Name)
	}
	n := 0
	for _, name := range p.names {
		if _, ok := ir.LayerIndex(name); ok {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("%s has no decoder layers to checkpoint", p.Name)
	}
	return n, nil
}

// FirstLayers are the settings that checkpoint no layer, named none, and
// the first k of n layers for k from 1 to n, named by first, a format of
// k.
func FirstLayers(none, first string, n int) []LayerSetting {
	out := []LayerSetting{{Name: none, Checkpoint: func(int, int) bool { return false }}}
	for k := 1; k <= n; k++ {
		out = append(out, LayerSetting{Name: fmt.Sprintf(first, k), Checkpoint: func(i, _ int) bool { return i < k }})
	}
	return out
}

// CheapestLayers plans every setting and returns the cheapest that fits,
// with its index; nil and -1 when none does. A setting whose keep set no
// layer has is passed over.
func (p *Problem) CheapestLayers(o *Options, settings []LayerSetting) (*Plan, int, error) {
	var best *Plan
	at := -1
	for k, s := range settings {
		if s.KeepSet != "" {
			if _, ok := p.policyEverywhere(s.KeepSet); !ok {
				continue
			}
		}
		plan, err := p.PlanLayers(o, s)
		if err != nil {
			return nil, -1, err
		}
		if plan.Feasible && (best == nil || cheaper(plan, best)) {
			best, at = plan, k
		}
	}
	return best, at, nil
}

// cheaper reports whether plan a of a setting costs less than plan b: in
// time, its micro-batches' cost with its paging; in FLOPs, which do not
// price paging, the one that pages less, then the cheaper.
func cheaper(a, b *Plan) bool {
	if a.Unit == TimeUnit {
		m := float64(a.MicroBatches())
		return a.Cost*m+a.PagingCost < b.Cost*m+b.PagingCost
	}
	if a.PagedOutBytes != b.PagedOutBytes {
		return a.PagedOutBytes < b.PagedOutBytes
	}
	return a.Cost < b.Cost
}
