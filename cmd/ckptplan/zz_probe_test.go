package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/solver"
	"github.com/ckptplan/ckptplan/stage"
)

func TestZZProbe(t *testing.T) {
	args := strings.Fields(os.Getenv("PROBE_ARGS"))
	if len(args) == 0 {
		t.Skip()
	}
	fs := newFlags("plan", "MODEL", io.Discard)
	pf := addPlanFlags(fs, true)
	src, opt, err := pf.parse(fs, args)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pf.problem(src)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(opt)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := p.Schedule(plan)
	if err != nil {
		t.Fatal(err)
	}
	r, err := solver.Simulate(p.Chain, sched)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("static", p.Static, "peak", r.Peak+p.Static, plan.PeakBytes)
	for k, op := range sched {
		u := r.Usage[k]
		fmt.Printf("%v %d act %d tape %d grad %d pg %d args %d tr %d\n", op, int64(r.Timeline[k]+p.Static), int64(u.Activations), int64(u.Tapes), int64(u.Gradients), int64(u.ParamGrads), int64(u.Arguments), int64(u.Transient))
	}
	if os.Getenv("PROBE_STAGE") == "" {
		return
	}
	var si, ki int
	fmt.Sscan(os.Getenv("PROBE_STAGE"), &si, &ki)
	st := p.Stages[si]
	k := &st.KeepSets[ki]
	fmt.Println("keepset", k.Name, "tape", st.TapeBytes)
	g := p.Costs.Graph
	prog := append(st.RecomputeProgram(k), st.BackwardProgram()...)
	var live int64
	alive := map[int]int64{}
	for _, e := range prog {
		if e.Buf == stage.StorageBuf && e.Kind == stage.Alloc {
			alive[e.Storage] = int64(e.Bytes)
		}
		if e.Buf == stage.StorageBuf && e.Kind == stage.Free {
			delete(alive, e.Storage)
		}
		if e.Kind == stage.Alloc && e.Buf == stage.KernelBuf && g.Nodes[e.Node].Name == os.Getenv("PROBE_AT") {
			for s, b := range alive {
				fmt.Println("ALIVE", p.Costs.StorageName(s), b)
			}
		}
		switch e.Kind {
		case stage.Alloc:
			live += int64(e.Bytes)
		case stage.Free:
			live -= int64(e.Bytes)
		}
		name := ""
		if e.Buf == stage.StorageBuf && (e.Kind == stage.Alloc || e.Kind == stage.Free) {
			name = p.Costs.StorageName(e.Storage)
		}
		fmt.Println(live, e.Kind, e.Buf, g.Nodes[e.Node].Name, int64(e.Bytes), name)
	}
}
