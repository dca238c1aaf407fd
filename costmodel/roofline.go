package costmodel

// Roofline: the time of a step, op by op.
//
// FLOPs rank recomputation badly: a recomputed norm, activation or
// rotary embedding costs no FLOPs worth counting (flops counts products
// only) but reads and writes its tensors, often several times, and an
// attention's softmax is bounded by memory, not by the tensor cores. The
// roofline model (Williams, Waterman and Patterson, "Roofline: an
// insightful visual performance model", CACM 2009) prices each op at the
// larger of its compute time and its memory time:
//
//	t = max(FLOPs / (peak · e_c), bytes / (bandwidth · e_m))
//
// with products on the matrix units (the device's dense 16-bit peak, or
// its fp32 peak for an fp32 step) and everything else on its vector
// units, each at a documented efficiency. An op's bytes are those it
// reads and writes — its inputs, its output, a product's weight — times
// the kernels PyTorch
// runs for it in eager mode (an RMSNorm as transformers writes it is six
// passes over its input: the fp32 copy, the square, the mean, the
// reciprocal square root's product, the cast back, the weight's
// product). Its backward reads and writes about twice its forward's
// bytes. Each kernel also costs its launch: on a GPU the host queues
// kernels ahead of the device, so an op takes at least its launches'
// time and no more where its work is longer; on the CPU the host runs
// the op, and the dispatch adds to the work (Synchronous).
//
// A node's time is its forward and backward in picoseconds, integers as
// FLOPs are, so that the planner's stages, keep sets and solvers price
// schedules in time exactly as they do in FLOPs (Costs.InTime).

import (
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/ir"
)

// Roofline is what prices an op's time on a device.
type Roofline struct {
	// MatrixFLOPS is the dense product throughput in 16-bit dtypes and
	// MatrixFP32FLOPS in fp32 (tf32 is not assumed), FLOP/s.
	MatrixFLOPS     float64 `json:"matrix_flops" yaml:"matrix_flops"`
	MatrixFP32FLOPS float64 `json:"matrix_fp32_flops" yaml:"matrix_fp32_flops"`
	// AttentionFLOPS is what a fused attention kernel reaches, FLOP/s as
	// flops counts them (4·b·h·s²·d forward, causal or not); 0: the
	// matrix peak at an attention efficiency.
	AttentionFLOPS float64 `json:"attention_flops,omitempty" yaml:"attention_flops,omitempty"`
	// BandwidthBytes is the memory bandwidth, bytes/s.
	BandwidthBytes float64 `json:"bandwidth_bytes" yaml:"bandwidth_bytes"`
	// MatrixEfficiency and BandwidthEfficiency are the shares of those
	// peaks that training's kernels reach.
	MatrixEfficiency    float64 `json:"matrix_efficiency" yaml:"matrix_efficiency"`
	BandwidthEfficiency float64 `json:"bandwidth_efficiency" yaml:"bandwidth_efficiency"`
	// LinkBytes is the bandwidth a GPU's collectives run at, bytes/s one
	// way, and LinkEfficiency the share of it NCCL's bus bandwidth
	// reaches (Collectives); 0: collectives are not priced.
	LinkBytes      float64 `json:"link_bytes,omitempty" yaml:"link_bytes,omitempty"`
	LinkEfficiency float64 `json:"link_efficiency,omitempty" yaml:"link_efficiency,omitempty"`
	// HostBytes is the bandwidth between the GPU and the host's memory,
	// bytes/s one way, and HostEfficiency the share of it that pages
	// moved by the driver reach (PagingSeconds); 0: paging is not priced.
	HostBytes      float64 `json:"host_bytes,omitempty" yaml:"host_bytes,omitempty"`
	HostEfficiency float64 `json:"host_efficiency,omitempty" yaml:"host_efficiency,omitempty"`
	// LaunchSeconds is the host's time to queue (or dispatch) one kernel.
	LaunchSeconds float64 `json:"launch_seconds" yaml:"launch_seconds"`
	// Synchronous: the host runs the kernels (a CPU), so that launches add
	// to an op's work rather than hide behind it.
	Synchronous bool   `json:"synchronous,omitempty" yaml:"synchronous,omitempty"`
	Source      string `json:"source,omitempty" yaml:"source,omitempty"`
}

// The efficiencies of a GPU's roofline, measured on an NVIDIA H200
// (PyTorch 2.11, bf16 transformers Llamas of hidden 1024 to 4096, 8K to
// 16K tokens a step, the kernels' times from PyTorch's profiler;
// docs/validation.md): cuBLAS's products reach 0.73–0.80 of the dense
// peak inside a step (NVIDIA's "Matrix Multiplication Background" guide
// gives about 70% on A100 and H100); an elementwise add over buffers far
// larger than the caches 0.88–0.90 of the bandwidth. The host's time a
// kernel, in an eager step of transformers' modules with fused AdamW,
// was 51–68 µs per kernel ckptplan counts (the profiler sees 1.7–2.1
// kernels for each: copies, fills and casts it does not count); an op
// priced at the larger of its launches and its work overcounts where the
// host's and the device's time interleave, and 40 µs puts the measured
// steps nearest. A host runs eager PyTorch faster or slower than that
// one, and a compiled model launches far fewer kernels: --roofline
// replaces any of them.
const (
	gpuMatrixEfficiency    = 0.75
	gpuBandwidthEfficiency = 0.89
	gpuLaunchSeconds       = 40e-6
	// NCCL's collectives reach a bus bandwidth (nccl-tests' busbw) near
	// the link's one-way figure on large messages, less on the buckets a
	// training step sends: 80%, an estimate (not measured here).
	gpuLinkEfficiency = 0.8
	// Pages of unified memory the driver evicts to the host and brings
	// back move over PCIe in 2 MiB blocks (cudaMemPrefetchAsync's unit);
	// taken at the same 80% of the slot's one-way figure, an estimate
	// (not measured here): page faults, where the prefetch did not bring
	// a page, move less.
	gpuHostEfficiency = 0.8
	// Fused attention, counted at its full 4·b·h·s²·d FLOPs forward (a
	// causal kernel skips half): cuDNN's flash kernels on the H200 reached
	// 0.65–0.77 of the dense peak forward and backward at 2,048–4,096
	// tokens, head dim 64 (FlashAttention-2 reports 50–73% of an A100's
	// peak forward, counting the causal half: Dao, 2023, figures 5–7).
	gpuAttentionEfficiency = 0.7
)

// Roofline returns the device's roofline, or false for a device known by
// its memory alone.
func (d Device) Roofline() (Roofline, bool) {
	if d.BF16FLOPS == 0 || d.BandwidthBytes == 0 {
		return Roofline{}, false
	}
	return Roofline{MatrixFLOPS: d.BF16FLOPS, MatrixFP32FLOPS: d.FP32FLOPS, AttentionFLOPS: d.BF16FLOPS * gpuAttentionEfficiency, BandwidthBytes: d.BandwidthBytes,
		MatrixEfficiency: gpuMatrixEfficiency, BandwidthEfficiency: gpuBandwidthEfficiency, LaunchSeconds: gpuLaunchSeconds,
		LinkBytes: d.LinkBytes, LinkEfficiency: gpuLinkEfficiency, HostBytes: d.HostBytes, HostEfficiency: gpuHostEfficiency, Source: d.Source}, true
}

// PagingSeconds is the time the driver takes to move bytes of unified
// memory to the host and back, over the host link at its efficiency; 0
// where the roofline has no host link.
func (r Roofline) PagingSeconds(bytes int64) float64 {
	if r.HostBytes == 0 || bytes <= 0 {
		return 0
	}
	return 2 * float64(bytes) / (r.HostBytes * r.HostEfficiency)
}

// Check refuses a roofline that prices nothing.
func (r Roofline) Check() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"matrix FLOP/s", r.MatrixFLOPS}, {"fp32 matrix FLOP/s", r.MatrixFP32FLOPS}, {"bandwidth", r.BandwidthBytes},
		{"matrix efficiency", r.MatrixEfficiency}, {"bandwidth efficiency", r.BandwidthEfficiency}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("roofline: %s must be positive, got %g", f.name, f.v)
		}
	}
	if r.MatrixEfficiency > 1 || r.BandwidthEfficiency > 1 {
		return fmt.Errorf("roofline: an efficiency is a share of a peak, at most 1")
	}
	if !(r.AttentionFLOPS >= 0) || math.IsInf(r.AttentionFLOPS, 0) {
		return fmt.Errorf("roofline: attention FLOP/s must be positive (or 0: the matrix peak's), got %g", r.AttentionFLOPS)
	}
	if !(r.LinkBytes >= 0) || math.IsInf(r.LinkBytes, 0) {
		return fmt.Errorf("roofline: link bandwidth must be positive (or 0: collectives not priced), got %g", r.LinkBytes)
	}
	if r.LinkBytes > 0 && (!(r.LinkEfficiency > 0) || r.LinkEfficiency > 1) {
		return fmt.Errorf("roofline: link efficiency is a share of the link, above 0 and at most 1, got %g", r.LinkEfficiency)
	}
	if !(r.HostBytes >= 0) || math.IsInf(r.HostBytes, 0) {
		return fmt.Errorf("roofline: host link bandwidth must be positive (or 0: paging not priced), got %g", r.HostBytes)
	}
	if r.HostBytes > 0 && (!(r.HostEfficiency > 0) || r.HostEfficiency > 1) {
		return fmt.Errorf("roofline: host link efficiency is a share of the link, above 0 and at most 1, got %g", r.HostEfficiency)
	}
	if !(r.LaunchSeconds >= 0) || math.IsInf(r.LaunchSeconds, 0) {
		return fmt.Errorf("roofline: launch time must be zero or more, got %g", r.LaunchSeconds)
	}
	return nil
}

// kernels is how many kernels PyTorch runs for an op in eager mode, each
// reading and writing about the op's tensors; 0 for a view.
func kernels(n *ir.Node) int {
	switch n.Op {
	case ir.Input, ir.Reshape, ir.Transpose, ir.Split:
		return 0
	case ir.RMSNorm:
		if n.Attrs.Upcast {
			return 6
		}
		return 4
	case ir.RoPE:
		// q·cos + rotate_half(q)·sin: two slices' copies (cat), a
		// negation, two products and a sum.
		return 5
	case ir.CrossEntropy:
		return 2 // log_softmax, nll_loss
	case ir.Dropout:
		return 2 // the mask, the product
	case ir.Softmax:
		if n.Attrs.Upcast {
			return 2 // in fp32, the cast back
		}
	}
	return 1
}

// matrix reports whether an op runs on the matrix units.
func matrix(n *ir.Node) bool {
	switch n.Op {
	case ir.Linear, ir.ExpertLinear, ir.MatMul, ir.Attention:
		return true
	case ir.Aten:
		return n.Attrs.FLOPs > 0
	}
	return false
}

// NodeTime is a node's forward and backward time, picoseconds.
type NodeTime struct{ Forward, Backward int64 }

// maxTime bounds a step's time in picoseconds (about 53 days), so that
// sums of it stay in int64.
const maxTime = 1 << 62

// Times prices every node of c on r; an error wrapping ir.ErrTooLarge
// where the step's time passes what int64 picoseconds count.
func (c *Costs) Times(r Roofline) ([]NodeTime, error) {
	g := c.Graph
	out := make([]NodeTime, len(g.Nodes))
	fp32 := g.Setup.DType == "fp32" && g.Setup.Autocast == ""
	var total float64 // picoseconds, every op's forward and backward
	tp := tensorParallel{c: c, r: r, reduced: map[int]bool{}}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		k := kernels(n)
		if k == 0 {
			continue
		}
		var bytes int64
		for _, in := range n.Inputs {
			bytes += g.Nodes[in].Bytes()
		}
		bytes += c.Nodes[i].OutputBytes + c.ExtraBytes(i)
		// A product reads its weight too; a quantized one (QLoRA) first
		// dequantizes it, a kernel of its own that reads the packed
		// weight and writes the training dtype's, in the forward and
		// again in the backward.
		var dequant int64
		quant := quantizedWeights(g, i)
		switch n.Op {
		case ir.Linear, ir.ExpertLinear:
			in := g.Nodes[n.Inputs[0]].Shape.Last()
			experts := max(n.Attrs.Experts, 1)
			bytes += experts * in * n.Attrs.Out * n.DType.Size()
			if g.Setup.Quant != "" {
				for _, q := range quant {
					dequant += quantBytes(q, g.Setup.Quant, g.Setup.DoubleQuant) + q.elems*n.DType.Size()
				}
			}
		}
		mem := float64(k) * float64(bytes) / (r.BandwidthBytes * r.BandwidthEfficiency)
		peak := r.MatrixFLOPS
		if fp32 {
			peak = r.MatrixFP32FLOPS
		}
		rate := peak * r.MatrixEfficiency
		if n.Op == ir.Attention && r.AttentionFLOPS > 0 {
			rate = r.AttentionFLOPS
			if fp32 {
				rate = min(rate, peak*r.MatrixEfficiency)
			}
		}
		price := func(flops int64, memory float64, launches int, comm float64) int64 {
			compute := 0.0
			if matrix(n) {
				compute = float64(flops) / rate
			}
			t := r.withLaunches(max(compute, memory), int64(launches))
			t += comm             // the next op waits for it
			total += 2 * t * 1e12 // this and its share of the sums
			return int64(min(math.Round(t*1e12), maxTime))
		}
		deq := func() int64 {
			if dequant == 0 {
				return 0
			}
			t := r.Seconds(Update{Bytes: dequant, Kernels: int64(len(quant))})
			total += 2 * t * 1e12
			return int64(min(math.Round(t*1e12), maxTime))
		}
		nc := &c.Nodes[i]
		fwdComm, bwdComm := tp.comm(i)
		out[i].Forward = price(nc.ForwardFLOPs, mem, k, fwdComm) + deq()
		if c.RequiresGrad(i) {
			launches := k
			if nc.ForwardFLOPs > 0 && nc.BackwardFLOPs > nc.ForwardFLOPs {
				launches = 2 * k // a product per input that needs a gradient
			}
			out[i].Backward = price(nc.BackwardFLOPs, 2*mem, launches, bwdComm) + deq()
		}
	}
	// A schedule reruns forwards: the bound leaves room for them.
	if !(total < maxTime/4) {
		return nil, fmt.Errorf("%s: its step takes %.3g s on this roofline, past what ckptplan counts in picoseconds: %w", g.Name, total*1e-12/2, ir.ErrTooLarge)
	}
	return out, nil
}

// withLaunches returns the time of work seconds run by launches kernels:
// on a GPU at least the launches' time, the host queueing ahead of the
// device; on a CPU (Synchronous) the two added, the host running both.
func (r Roofline) withLaunches(work float64, launches int64) float64 {
	host := float64(launches) * r.LaunchSeconds
	if r.Synchronous {
		return work + host
	}
	return max(work, host)
}

// tensorParallel prices Megatron-LM's tensor-parallel all-reduces
// (Shoeybi et al. 2019, §3): the output of a row-parallel linear (whose
// input is split over the ranks: the attention's output projection, the
// MLP's down projection) and of the vocabulary-parallel embedding in the
// forward, and in the backward the gradient of the input of the
// column-parallel linears that read a replicated tensor (the q, k and v
// projections together, gate and up together, the head), once a tensor.
// Under sequence parallelism each becomes a reduce-scatter and an
// all-gather, which move as much. They are on the critical path: the op
// after waits for them, so they add to the op's time, and a recomputed
// forward reruns them.
type tensorParallel struct {
	c       *Costs
	r       Roofline
	reduced map[int]bool // tensors whose gradient's all-reduce is priced
}

// comm returns node i's all-reduce time in its forward and its backward.
func (t tensorParallel) comm(i int) (forward, backward float64) {
	g := t.c.Graph
	ranks := g.Setup.Parallel.TP
	if ranks <= 1 || t.r.LinkBytes == 0 {
		return 0, 0
	}
	allReduce := func(bytes int64) float64 {
		return t.r.CommSeconds(int64(float64(bytes) * 2 * float64(ranks-1) / float64(ranks)))
	}
	n := &g.Nodes[i]
	switch n.Op {
	case ir.Embedding:
		return allReduce(n.Bytes()), 0
	case ir.Linear:
		in := n.Inputs[0]
		inSplit, outSplit := t.c.Storages[t.c.OutputStorage(in)].Sharded, t.c.Storages[t.c.OutputStorage(i)].Sharded
		switch {
		case inSplit && !outSplit:
			return allReduce(n.Bytes()), 0
		case !inSplit && outSplit && t.c.RequiresGrad(in) && !t.reduced[in]:
			t.reduced[in] = true
			return 0, allReduce(g.Nodes[in].Bytes())
		}
	}
	return 0, 0
}

// InTime returns a copy of c whose nodes' and blocks' FLOPs fields hold
// their times on r, in picoseconds: what the planner's stages and solvers
// then price schedules in.
func (c *Costs) InTime(r Roofline) (*Costs, error) {
	t := *c
	t.Nodes = append([]Node(nil), c.Nodes...)
	t.Blocks = append([]Block(nil), c.Blocks...)
	times, err := c.Times(r)
	if err != nil {
		return nil, err
	}
	t.ForwardFLOPs, t.BackwardFLOPs = 0, 0
	for i := range t.Nodes {
		t.Nodes[i].ForwardFLOPs, t.Nodes[i].BackwardFLOPs = times[i].Forward, times[i].Backward
		t.ForwardFLOPs += times[i].Forward
		t.BackwardFLOPs += times[i].Backward
	}
	for b := range t.Blocks {
		blk := &t.Blocks[b]
		blk.ForwardFLOPs, blk.BackwardFLOPs = 0, 0
		for _, id := range blk.Nodes {
			blk.ForwardFLOPs += times[id].Forward
			blk.BackwardFLOPs += times[id].Backward
		}
	}
	return &t, nil
}
