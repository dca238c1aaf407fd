package costmodel

// DeepSpeed's ZeRO stages 1 and 2 (stage_1_and_2.py, DeepSpeed 0.16), as
// the DeepSpeed export configures them (contiguous_gradients, no
// overlap_comm, reduce_bucket_size the largest layer's trainable
// parameters), reduce the gradients through three buffers:
//
//   - the bucket (ipg_buffer), reduce_bucket_size elements, allocated
//     when the engine's backward starts, before the loss's, and freed
//     when it ends;
//   - the rank's gradient partition (grads_in_partition), allocated at
//     the first reduction that reaches a parameter of the rank's
//     partition and freed by the optimizer step. DeepSpeed splits the
//     flattened 16-bit parameters evenly over the ranks (padded to a
//     multiple of twice the ranks) but keeps in the partition the whole
//     gradient of every parameter with an element in it: a parameter
//     across a boundary is held whole on both ranks;
//   - each reduction's flattened copy of what it reduces, split by the
//     rank each slice goes to.
//
// Stage 2 reduces in the backward: each gradient's hook reduces the
// bucket first when the gradient would overflow it, copies the gradient
// into it and frees it; a gradient larger than the bucket is held as it
// is, and reduced alone by the next hook (as stage 3's, deepSpeedReduce);
// the backward's epilogue reduces the rest. Stage 1 registers no hooks: autograd keeps
// every gradient to the backward's end, and the epilogue runs the same
// reductions over all of them, in the parameters' order, freeing each
// gradient as it copies it into the bucket.
//
// Which parameter crosses a partition's boundary depends on the order
// the model registered them, which ckptplan does not know within a
// block: the partition counts the part of the block's largest parameter
// that may lie beyond each boundary inside a block, and the larger of
// one parameter group and two (deepSpeedPartition). Stage 1's reductions
// then hold at most the partition and one flattened copy, a bucket or a
// gradient larger than it, beside the gradients not yet reduced (each
// reduction's copy is of gradients its bucket has already freed).

import (
	"github.com/ckptplan/ckptplan/ir"
)

// DeepSpeedBuckets is what DeepSpeed's ZeRO stages 1 and 2 hold to reduce
// the gradients beside the weights and the optimizer state (and stage
// 1's whole gradients).
type DeepSpeedBuckets struct {
	Stage  int64 // 1 or 2
	Bucket int64 // the bucket, from the loss's backward to the backward's end
	// Partition is the most the rank's gradient partition holds: under
	// stage 2 from the first reduction, in the backward, to the step;
	// under stage 1 from the backward's end.
	Partition int64
	// Hooks are, by block, the most stage 2's hooks hold beside the
	// bucket and the partition while the block's backward runs: a
	// gradient autograd made, a reduction's flattened copy, and a
	// gradient larger than the bucket held apart.
	Hooks map[string]int64
	// End is what the backward's last reductions hold beside the bucket:
	// under stage 2, beside the partition too; under stage 1, whose
	// every reduction is there, with it.
	End int64
}

// deepSpeedBuckets counts what DeepSpeed's stage (1 or 2) holds to
// reduce g's gradients, elt bytes each, over ranks ranks, with a bucket
// of bucket elements; nil where ckptplan does not know g's modules
// (deepSpeedModules).
func deepSpeedBuckets(g *ir.Graph, stage, elt, ranks, bucket int64) *DeepSpeedBuckets {
	mods, numel, noDecay, ok := deepSpeedModules(g)
	if !ok || bucket <= 0 {
		return nil
	}
	part := max(deepSpeedPartition(mods, numel, ranks, func(int) bool { return true }),
		deepSpeedPartition(mods, numel, ranks, func(p int) bool { return !noDecay[p] })+
			deepSpeedPartition(mods, numel, ranks, func(p int) bool { return noDecay[p] })) * elt
	d := &DeepSpeedBuckets{Stage: stage, Bucket: bucket * elt, Partition: part, Hooks: map[string]int64{}}
	if stage < 2 {
		var largest int64 // a gradient larger than the bucket, reduced alone
		for _, n := range numel {
			if n > bucket {
				largest = max(largest, n)
			}
		}
		d.End = max(bucket, largest)*elt + part
		return d
	}
	// What a hook holds: the gradients held apart from the bucket, the
	// gradient autograd just made, and when it reduces the bucket first,
	// the flattened copy, before the gradients held apart are copied
	// into the partition (made then, if no reduction made it before) and
	// freed.
	var queued, apart int64 // the elements the next reduction takes; the bytes held apart from the bucket
	for _, call := range deepSpeedTrace(mods, func(string) bool { return false }) {
		if call.forward {
			continue
		}
		m := mods[call.module]
		for _, p := range m.params {
			n := numel[p]
			moment := apart + n*elt
			if queued+n > bucket && queued > 0 {
				moment += queued * elt
				queued, apart = 0, 0
			}
			d.Hooks[m.block] = max(d.Hooks[m.block], moment)
			if queued+n > bucket {
				apart += n * elt
			}
			queued += n
		}
	}
	d.End = apart + queued*elt
	return d
}

// deepSpeedPartition returns the most elements a rank's gradient
// partition holds of the parameter group in says: its share of the
// group's flattened parameters (padded to a multiple of twice the ranks),
// and at each of its boundaries inside a block, the block's largest
// parameter of the group but one element, which may cross it and is held
// whole. DeepSpeed partitions each of the optimizer's parameter groups
// apart: one, or, as transformers' Trainer makes them, the weights and
// the biases and norms (without weight decay).
func deepSpeedPartition(mods []dsModule, numel []int64, ranks int64, in func(p int) bool) int64 {
	type span struct{ start, end, largest int64 }
	var blocks []span
	var total int64
	seen := map[int]bool{}
	for i, m := range mods {
		if i == 0 || mods[i-1].block != m.block {
			blocks = append(blocks, span{start: total, end: total})
		}
		b := &blocks[len(blocks)-1]
		for _, p := range m.params {
			if seen[p] || !in(p) {
				continue
			}
			seen[p] = true
			total += numel[p]
			b.end = total
			b.largest = max(b.largest, numel[p])
		}
	}
	if ranks <= 1 || total == 0 {
		return total
	}
	share := ceilDiv(total, 2*ranks) * 2
	crossing := func(at int64) int64 {
		for _, b := range blocks {
			if b.start < at && at < b.end {
				return b.largest - 1
			}
		}
		return 0
	}
	var most int64
	for r := range ranks {
		most = max(most, share+crossing(r*share)+crossing((r+1)*share))
	}
	return most
}
