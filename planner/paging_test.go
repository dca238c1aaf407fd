package planner

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"github.com/google/go-cmp/cmp"
)

// TestPagedOptimizerPagesWhatTheGPUCannotHold plans Llama 3 8B, fully
// fine-tuned in bf16 on an H100, with bitsandbytes' 8-bit AdamW and its
// paged twin. The paged one keeps in unified memory the moments of every
// trained tensor of 10^5 elements or more (bitsandbytes'
// get_state_buffer): here all but the norms' scales, a byte a moment,
// and its step brings back one tensor's at a time, the largest the
// embedding's or the head's, v × h. Where the 8-bit plan fits, the paged
// plan is the same; where it does not, the paged plan is the 8-bit plan
// at its least budget with what passes the budget on the host, at most
// all of that state but the largest tensor's, and each step moves it out
// and back over PCIe 5 (64 GB/s a way, at 80%).
func TestPagedOptimizerPagesWhatTheGPUCannotHold(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	d, err := costmodel.LookupDevice("h100-80gb")
	if err != nil {
		t.Fatal(err)
	}
	roof, _ := d.Roofline()
	build, err := ModelBuilder(src, &roof)
	if err != nil {
		t.Fatal(err)
	}
	const h, kv, f, v, l = 4096, 1024, 14336, 128256, 32
	const paged = 2 * (l*(2*h*h+2*h*kv+3*h*f) + 2*v*h) // two moments a byte
	const pageable mem.Bytes = paged - 2*v*h
	problem := func(opt ir.Optimizer, batch int64) *Problem {
		s := src.Model.Training
		s.DType, s.Optimizer, s.Batch, s.Seq = "bf16", opt, batch, 8192
		p, err := build(s)
		if err != nil {
			t.Fatal(err)
		}
		if st := p.Costs.Static; opt == ir.OptimizerPagedAdamW8bit && (st.PagedBytes != paged || st.PagedTensorBytes != 2*v*h) {
			t.Fatalf("paged state %d, largest tensor's %d; want %d and %d", st.PagedBytes, st.PagedTensorBytes, int64(paged), int64(2*v*h))
		}
		return p
	}
	on := &Options{Device: "h100-80gb"}
	plan := func(p *Problem, o *Options) *Plan {
		pl, err := p.Plan(o)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}

	// Micro-batch 1 fits with every moment on the GPU: nothing pages.
	eight, pagedP := plan(problem(ir.OptimizerAdamW8bit, 1), on), plan(problem(ir.OptimizerPagedAdamW8bit, 1), on)
	if !eight.Feasible || pagedP.PagedOutBytes != 0 || pagedP.PagingCost != 0 || pagedP.PeakBytes != eight.PeakBytes || pagedP.Cost != eight.Cost {
		t.Errorf("micro-batch 1: paged plan pages %v (%v), peak %v, cost %v; the 8-bit plan peaks at %v, costs %v",
			pagedP.PagedOutBytes, pagedP.PagingCost, pagedP.PeakBytes, pagedP.Cost, eight.PeakBytes, eight.Cost)
	}

	// Micro-batch 4 does not fit unpaged; paged, it does, paging what
	// passes the budget.
	p8, pp := problem(ir.OptimizerAdamW8bit, 4), problem(ir.OptimizerPagedAdamW8bit, 4)
	eight = plan(p8, on)
	if eight.Feasible {
		t.Fatal("micro-batch 4 fits with the 8-bit state on the GPU: the case no longer tests paging")
	}
	least := eight.MinBudgetBytes
	out := least - d.MemoryBytes
	if out <= 0 || out > pageable {
		t.Fatalf("the 8-bit plan needs %v, %v over the budget: not within the %v paging can free", least, out, pageable)
	}
	pagedP = plan(pp, on)
	if !pagedP.Feasible || pagedP.PagedOutBytes != out || pagedP.PeakBytes+pagedP.ReserveBytes != pagedP.BudgetBytes {
		t.Fatalf("paged: feasible %v, paged out %v (want %v), peak %v + reserve %v, budget %v",
			pagedP.Feasible, pagedP.PagedOutBytes, out, pagedP.PeakBytes, pagedP.ReserveBytes, pagedP.BudgetBytes)
	}
	if m := pagedP.Peak; m == nil || m.PagedOutBytes != out || m.Bytes() != pagedP.PeakBytes {
		t.Errorf("the peak's moment %+v: want %v paged out, adding up to the GPU's %v", m, out, pagedP.PeakBytes)
	}
	wantCost := math.Round(2 * float64(out) / (64e9 * 0.8) * 1e12)
	if pagedP.PagingCost != wantCost {
		t.Errorf("paging costs %v ps, want %v", pagedP.PagingCost, wantCost)
	}
	// The same schedule as the 8-bit plan given the memory it needs.
	atLeast := plan(p8, &Options{Device: "h100-80gb", Budget: least})
	if !atLeast.Feasible || !cmp.Equal(atLeast.Schedule, pagedP.Schedule) || atLeast.Cost != pagedP.Cost {
		t.Errorf("the paged plan's schedule is not the 8-bit plan's in %v", least)
	}
	if step, _ := pagedP.StepCost(); step != func() float64 { s, _ := atLeast.StepCost(); return s }()+wantCost {
		t.Errorf("the paged step costs %v, not the 8-bit step's plus paging", step)
	}
	if err := pp.Verify(pagedP); err != nil {
		t.Errorf("verify: %v", err)
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(pagedP); err != nil {
		t.Fatal(err)
	}
	read, err := ReadPlan(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := pp.Verify(read); err != nil || read.PagedOutBytes != out {
		t.Errorf("read back: paged out %v, verify %v", read.PagedOutBytes, err)
	}
	if rt, err := pp.LayerRuntime(pagedP); err != nil || !rt.Feasible || rt.PeakBytes+pagedP.ReserveBytes > pagedP.BudgetBytes {
		t.Errorf("layer by layer: %+v, %v", rt, err)
	}

	// Below what paging everything but the largest tensor leaves, it does
	// not fit, and says how much would.
	tight := &Options{Device: "h100-80gb", Budget: least - pageable - 1}
	if p := plan(pp, tight); p.Feasible || p.MinBudgetBytes != least-pageable {
		t.Errorf("in %v: feasible %v, least budget %v; want %v", tight.Budget, p.Feasible, p.MinBudgetBytes, least-pageable)
	}
	if p := plan(pp, &Options{Device: "h100-80gb", Budget: least - pageable}); !p.Feasible || p.PagedOutBytes != pageable {
		t.Errorf("in %v: feasible %v, paged out %v; want %v", least-pageable, p.Feasible, p.PagedOutBytes, pageable)
	}
	sf, err := pp.Shortfall(tight)
	if err != nil || sf.NeedBytes != least-pageable || sf.PageableBytes != pageable {
		t.Errorf("shortfall %+v (%v): want it to need %v with %v pageable", sf, err, least-pageable, pageable)
	}
	// Where static memory passes the budget alone with the paged state
	// on the GPU but not on the host, it is not the static memory that
	// passes it.
	static := mem.Bytes(pp.Costs.Static.Total())
	for _, c := range []struct {
		budget mem.Bytes
		passes bool
	}{{static - pageable/2, false}, {static - pageable, true}} {
		sf, err := pp.Shortfall(&Options{Budget: c.budget, Reserve: NoReserve})
		if err != nil || sf.StaticPasses() != c.passes || c.passes && !strings.Contains(sf.String(), "even with") {
			t.Errorf("in %v of static %v: shortfall %v (%v), static passes %v", c.budget, static, sf, err, c.passes)
		}
	}

	// Where the host link is fast beside the compute, paging more to
	// recompute less makes a quicker step: with the paged fp32 AdamW's
	// 8 bytes a parameter, and a host link of 10^15 B/s, the plan pages
	// more than the least it must and recomputes less.
	fast := roof
	fast.HostBytes = 1e15
	quick, err := ModelBuilder(src, &fast)
	if err != nil {
		t.Fatal(err)
	}
	s := src.Model.Training
	s.DType, s.Optimizer, s.Batch, s.Seq = "bf16", ir.OptimizerPagedAdamW, 1, 8192
	slow, err := build(s)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := quick(s)
	if err != nil {
		t.Fatal(err)
	}
	leastPaged, more := plan(slow, on), plan(qp, on)
	if !leastPaged.Feasible || leastPaged.PagedOutBytes == 0 || !more.Feasible || more.PagedOutBytes <= leastPaged.PagedOutBytes || more.Cost >= leastPaged.Cost {
		t.Errorf("over PCIe: pages %v, costs %v; over a fast host link: pages %v, costs %v: want it to page more and recompute less",
			leastPaged.PagedOutBytes, leastPaged.Cost, more.PagedOutBytes, more.Cost)
	}

	// Under DeepSpeed's ZeRO the optimizer sees one flat partition of the
	// rank's trained parameters: paged whole, and updated at once, so
	// nothing pages out; under FSDP2 each tensor's shard is paged and
	// updated apart.
	const params = l*(2*h*h+2*h*kv+3*h*f+2*h) + 2*v*h + h
	for _, c := range []struct {
		sharding      ir.Sharding
		zero          int64
		paged, tensor int64
	}{
		{ir.ShardingDeepSpeed, 2, 2 * ((params + 7) / 8), 2 * ((params + 7) / 8)},
		{ir.ShardingFSDP2, 3, (paged + 7) / 8, (2*v*h + 7) / 8},
	} {
		s := s
		s.Optimizer = ir.OptimizerPagedAdamW8bit
		s.Parallel.DP, s.Parallel.Zero, s.Parallel.Sharding = 8, c.zero, c.sharding
		p, err := build(s)
		if err != nil {
			t.Fatal(err)
		}
		if st := p.Costs.Static; st.PagedBytes != c.paged || st.PagedTensorBytes != c.tensor || p.pageable != mem.Bytes(c.paged-c.tensor) {
			t.Errorf("%s, ZeRO %d: paged %d, its largest tensor's %d, pageable %v; want %d and %d",
				c.sharding, c.zero, st.PagedBytes, st.PagedTensorBytes, p.pageable, c.paged, c.tensor)
		}
	}
}

// TestSettingsPageWhereTheStateCanPage: over several GPUs, fit tries the
// paged 8-bit optimizer under plain data parallelism and FSDP2's ZeRO 3,
// whose optimizers see each tensor (or its shard), and not under
// DeepSpeed's ZeRO 1 and 2, whose optimizer sees one flat partition.
func TestSettingsPageWhereTheStateCanPage(t *testing.T) {
	var got []int64
	for _, c := range settings(ir.Setup{}, 8, func(Change) bool { return false }) {
		if c.Optimizer == ir.OptimizerPagedAdamW8bit {
			got = append(got, c.Zero)
		}
	}
	if want := []int64{0, 3}; !cmp.Equal(got, want) { // 0: the base's, plain data parallelism
		t.Errorf("paged under ZeRO %v, want %v", got, want)
	}
}
