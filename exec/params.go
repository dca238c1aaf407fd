package exec

import (
	"math"
	"math/rand"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/exec/kernel"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// params are one node's weights and their gradients (nil when frozen).
type params struct {
	w, b, loraA, loraB     []float32
	dw, db, dLoraA, dLoraB []float32
}

// static allocates the weights (seeded), gradients, optimizer state and
// buffers through the tracker: the plan's static memory.
func (r *Runner) static(seed int64) {
	g, c := r.g, r.c
	rng := rand.New(rand.NewSource(seed))
	uniform := func(buf []float32, scale float64) {
		for i := range buf {
			buf[i] = float32((2*rng.Float64() - 1) * scale)
		}
	}
	r.params = make([]params, len(g.Nodes))
	alloc := func(n int64, label string) []float32 {
		return r.tr.Alloc(int(n), mem.Bytes(4*n), label).F
	}
	// Gradients that appear in the backward are counted there
	// (stage.ParamGradBuf).
	allocGrad := alloc
	if c.GradientsInBackward() {
		allocGrad = func(n int64, _ string) []float32 { return make([]float32, n) }
	}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		p := &r.params[i]
		trains := !n.Attrs.Frozen
		switch n.Op {
		case ir.Embedding:
			p.w = alloc(n.Attrs.Vocab*n.Attrs.Out, n.Name+".weight")
			uniform(p.w, 0.1)
			if trains {
				p.dw = allocGrad(n.Attrs.Vocab*n.Attrs.Out, n.Name+".weight.grad")
			}
		case ir.Linear:
			in := g.Nodes[n.Inputs[0]].Shape.Last()
			if n.Attrs.Tied == "" {
				p.w = alloc(in*n.Attrs.Out, n.Name+".weight")
				uniform(p.w, 1/math.Sqrt(float64(in)))
				if trains {
					p.dw = allocGrad(in*n.Attrs.Out, n.Name+".weight.grad")
				}
				if n.Attrs.Bias {
					p.b = alloc(n.Attrs.Out, n.Name+".bias")
					uniform(p.b, 0.1)
					if trains {
						p.db = allocGrad(n.Attrs.Out, n.Name+".bias.grad")
					}
				}
			}
			if rank := n.Attrs.LoRARank; rank > 0 {
				p.loraA, p.loraB = alloc(in*rank, n.Name+".lora_a"), alloc(rank*n.Attrs.Out, n.Name+".lora_b")
				uniform(p.loraA, 1/math.Sqrt(float64(in)))
				uniform(p.loraB, 1/math.Sqrt(float64(rank)))
				p.dLoraA, p.dLoraB = allocGrad(in*rank, n.Name+".lora_a.grad"), allocGrad(rank*n.Attrs.Out, n.Name+".lora_b.grad")
			}
		case ir.ExpertLinear:
			size := n.Attrs.Experts * g.Nodes[n.Inputs[0]].Shape.Last() * n.Attrs.Out
			p.w = alloc(size, n.Name+".weight")
			uniform(p.w, 1/math.Sqrt(float64(g.Nodes[n.Inputs[0]].Shape.Last())))
			if trains {
				p.dw = allocGrad(size, n.Name+".weight.grad")
			}
		case ir.LayerNorm, ir.RMSNorm:
			h := n.Shape.Last()
			p.w = alloc(h, n.Name+".weight")
			for k := range p.w {
				p.w[k] = 1 + float32(rng.Float64()-0.5)/4
			}
			if trains {
				p.dw = allocGrad(h, n.Name+".weight.grad")
			}
			if n.Op == ir.LayerNorm {
				p.b = alloc(h, n.Name+".bias")
				uniform(p.b, 0.1)
				if trains {
					p.db = allocGrad(h, n.Name+".bias.grad")
				}
			}
		}
	}
	for i := range g.Nodes {
		if t := g.Nodes[i].Attrs.Tied; t != "" {
			src, _ := g.Lookup(t)
			r.params[i].w, r.params[i].dw = r.params[src].w, r.params[src].dw
		}
	}
	if b := c.Static.OptimizerBytes + c.Static.Of(costmodel.Counters); b > 0 {
		r.tr.Alloc(0, mem.Bytes(b), "optimizer state")
	}
	r.rope = map[[2]int64][2][]float32{}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op != ir.RoPE {
			continue
		}
		k := [2]int64{n.Shape[len(n.Shape)-2], n.Shape.Last()}
		if _, ok := r.rope[k]; ok {
			continue
		}
		cos, sin := alloc(k[0]*k[1], "rope.cos"), alloc(k[0]*k[1], "rope.sin")
		theta := n.Attrs.Theta
		if theta == 0 {
			theta = 10000
		}
		kernel.RopeTables(cos, sin, int(k[0]), int(k[1]), theta)
		r.rope[k] = [2][]float32{cos, sin}
		if g.Setup.BuffersBytes == 0 {
			// The rotary module's buffer of inverse frequencies, which
			// the model holds beside the tables it made from them.
			inv := alloc(k[1]/2, "rope.inv_freq")
			for j := range inv {
				inv[j] = float32(1 / math.Pow(theta, float64(2*j)/float64(k[1])))
			}
		}
	}
	if b := g.Setup.BuffersBytes; b > 0 {
		r.tr.Alloc(0, mem.Bytes(b), "buffers") // as measured on the live model
	}
}
