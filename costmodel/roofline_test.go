package costmodel

import (
	"errors"
	"math"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
)

// TestRooflineTimes prices tiny-llama's ops by hand: a product at its
// FLOPs over the matrix peak, an elementwise op at its bytes over the
// bandwidth, each at least its launches on a GPU, plus them on a CPU.
func TestRooflineTimes(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	c := analyzeModel(t, src.Model)
	g := c.Graph
	gpu := Roofline{MatrixFLOPS: 1e12, MatrixFP32FLOPS: 1e11, BandwidthBytes: 1e8, MatrixEfficiency: 0.5, BandwidthEfficiency: 0.8, LaunchSeconds: 1e-6}
	cpu := gpu
	cpu.Synchronous = true
	ps := func(s float64) int64 { return int64(math.Round(s * 1e12)) }
	seen := map[ir.Op]bool{}
	for _, r := range []Roofline{gpu, cpu} {
		times, err := c.Times(r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range g.Nodes {
			n := &g.Nodes[i]
			var want int64
			io := float64(c.Nodes[i].OutputBytes + c.ExtraBytes(i))
			for _, in := range n.Inputs {
				io += float64(g.Nodes[in].Bytes())
			}
			launch := 1e-6
			if n.Op == ir.Linear { // its weight too
				io += float64(g.Nodes[n.Inputs[0]].Shape.Last() * n.Attrs.Out * 4)
			}
			switch n.Op {
			case ir.Input, ir.Reshape, ir.Transpose, ir.Split:
				want = 0
			case ir.Linear, ir.MatMul:
				// tiny-llama trains in fp32: the fp32 peak
				compute := float64(c.Nodes[i].ForwardFLOPs) / (1e11 * 0.5)
				work := max(compute, io/(1e8*0.8))
				want = ps(max(work, launch))
				if r.Synchronous {
					want = ps(work + launch)
				}
			case ir.Add, ir.Mul, ir.SiLU:
				work := io / (1e8 * 0.8)
				want = ps(max(work, launch))
				if r.Synchronous {
					want = ps(work + launch)
				}
			default:
				continue
			}
			seen[n.Op] = true
			if d := times[i].Forward - want; d < -1 || d > 1 {
				t.Errorf("%s (%s), synchronous %v: forward %d ps, want %d", n.Name, n.Op, r.Synchronous, times[i].Forward, want)
			}
		}
	}
	for _, op := range []ir.Op{ir.Linear, ir.MatMul, ir.Add, ir.Mul, ir.SiLU, ir.Reshape} {
		if !seen[op] {
			t.Errorf("no %s in tiny-llama", op)
		}
	}
	timed, err := c.InTime(gpu)
	if err != nil {
		t.Fatal(err)
	}
	slow := gpu
	slow.MatrixFLOPS, slow.MatrixFP32FLOPS, slow.BandwidthBytes = 1e-3, 1e-3, 1e-3
	if _, err := c.InTime(slow); !errors.Is(err, ir.ErrTooLarge) {
		t.Errorf("a step of years in picoseconds: %v", err)
	}
	var sum int64
	for _, b := range timed.Blocks {
		sum += b.ForwardFLOPs
	}
	if sum != timed.ForwardFLOPs || c.ForwardFLOPs == timed.ForwardFLOPs || c.Nodes[5].ForwardFLOPs != analyzeModel(t, src.Model).Nodes[5].ForwardFLOPs {
		t.Errorf("InTime: blocks %d ps, total %d ps; the FLOPs' costs changed: %v", sum, timed.ForwardFLOPs, c.ForwardFLOPs == timed.ForwardFLOPs)
	}
}

func TestRooflineOfDevices(t *testing.T) {
	for _, d := range Devices {
		r, ok := d.Roofline()
		if !ok || r.Check() != nil || r.MatrixFP32FLOPS >= r.MatrixFLOPS || r.BandwidthBytes < 1e11 {
			t.Errorf("%s: %+v", d.Name, r)
		}
	}
	if _, ok := (Device{Name: "24GiB", MemoryBytes: 24 << 30}).Roofline(); ok {
		t.Error("a device known by its memory has a roofline")
	}
}
