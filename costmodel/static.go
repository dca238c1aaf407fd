package costmodel

import (
	"fmt"

	"github.com/ckptplan/ckptplan/ir"
)

// Static is the memory of one rank that does not depend on the schedule:
// weights, their gradients and the optimizer state.
type Static struct {
	Parameters          int64 // of the whole model
	TrainableParameters int64 // of the whole model
	WeightsBytes        int64 // on one rank
	GradientsBytes      int64 // on one rank
	OptimizerBytes      int64 // on one rank, fp32 master weights included
	// BuffersBytes are the model's non-trained tensors that live for the
	// whole step: the rotary embedding's cos and sin tables.
	BuffersBytes int64
}

// Total returns the static bytes of one rank.
func (s Static) Total() int64 {
	return s.WeightsBytes + s.GradientsBytes + s.OptimizerBytes + s.BuffersBytes
}

// staticMemory follows the usual mixed-precision accounting (Rajbhandari
// et al. 2020, ZeRO, §3): weights and gradients in the training dtype;
// AdamW keeps two fp32 moments per trainable parameter, and 16-bit training
// an fp32 master copy. Only trainable parameters (LoRA adapters, under
// LoRA) have gradients and optimizer state. Tensor parallelism splits the
// weights of linears and embeddings over tp ranks (norms are replicated);
// ZeRO stage 1 splits the optimizer state over dp ranks, stage 2 also the
// gradients, stage 3 (FSDP's full sharding) also the weights. LoRA
// adapters kept in fp32 over 16-bit weights need no master copy; nor do a
// traced op's parameters in a dtype of their own that is 32 bits wide.
func staticMemory(g *ir.Graph) (Static, error) {
	s := g.Setup
	e := g.DType.Size()
	if e == 0 {
		return Static{}, fmt.Errorf("graph %s has no dtype", g.Name)
	}
	tp, dp := max(s.Parallel.TP, 1), max(s.Parallel.DP, 1)
	var perParam int64 // optimizer bytes per trainable parameter, master copy aside
	switch s.Optimizer {
	case "adamw", "":
		perParam = 8
	case "sgd", "none":
	default:
		return Static{}, fmt.Errorf("unknown optimizer %q (valid: adamw, sgd, none)", s.Optimizer)
	}
	fp32Adapters := s.LoRA.FP32 && s.LoRA.Rank > 0 && e < 4
	var params, trainable, rankTrainable, weights, grads, masters int64
	var approx float64 // bytes, in float64: it cannot wrap
	for i := range g.Nodes {
		n := &g.Nodes[i]
		p, tr := g.Params(i), g.TrainableParams(i)
		params += p
		trainable += tr
		if n.Op == ir.Linear || n.Op == ir.Embedding {
			p, tr = ceilDiv(p, tp), ceilDiv(tr, tp)
		}
		// A traced op's parameters may be in a dtype of their own.
		size := e
		if n.Op == ir.Aten && n.Attrs.ParamDType != ir.Invalid {
			size = n.Attrs.ParamDType.Size()
		}
		approx += float64(p) * float64(2*size+perParam+4)
		rankTrainable += tr
		weights += p * size
		grads += tr * size
		if size < 4 {
			masters += tr
		}
	}
	// Each count fits (ir checks every weight's size); their sums and
	// products with bytes per parameter must too.
	if approx > 1<<62 {
		return Static{}, fmt.Errorf("graph %s: its weights, gradients and optimizer state pass 2^62 bytes: too large to count", g.Name)
	}
	st := Static{
		Parameters: params, TrainableParameters: trainable,
		WeightsBytes:   weights,
		GradientsBytes: grads,
		OptimizerBytes: rankTrainable * perParam,
	}
	if s.Optimizer != "none" && !fp32Adapters {
		st.OptimizerBytes += masters * 4 // the fp32 master copy of 16-bit trained weights
	}
	if fp32Adapters {
		// PEFT's adapters over 16-bit weights: fp32 weights and gradients.
		st.WeightsBytes = weights - rankTrainable*e + rankTrainable*4
		st.GradientsBytes = rankTrainable * 4
	}
	if s.Parallel.Zero >= 1 {
		st.OptimizerBytes = ceilDiv(st.OptimizerBytes, dp)
	}
	if s.Parallel.Zero >= 2 {
		st.GradientsBytes = ceilDiv(st.GradientsBytes, dp)
	}
	if s.Parallel.Zero >= 3 {
		st.WeightsBytes = ceilDiv(st.WeightsBytes, dp)
	}
	st.BuffersBytes = ropeTables(g)
	return st, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// ropeTables returns the bytes of the cos and sin tables the model holds
// through the step: one pair per distinct (sequence, head size) among the
// graph's RoPE nodes when the model makes them once, none when its layers
// make their own (their copies are the layers' activations), and a pair
// for every position in each layer whose RoPE indexes a cache of its own.
func ropeTables(g *ir.Graph) int64 {
	seen := map[[2]int64]bool{}
	cached := map[string]bool{}
	inLayer := false
	var model, b int64
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Op != ir.RoPE {
			continue
		}
		inLayer = inLayer || n.Attrs.Tables
		if c := n.Attrs.CacheLen; c > 0 && !cached[n.Block] {
			cached[n.Block] = true
			b += 2 * c * n.Shape.Last() * g.DType.Size()
		}
		k := [2]int64{n.Shape[len(n.Shape)-2], n.Shape.Last()}
		if !seen[k] {
			seen[k] = true
			model += 2 * k[0] * k[1] * g.DType.Size()
		}
	}
	if !inLayer {
		b += model
	}
	return b
}
