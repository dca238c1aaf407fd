// Cross-entropy of rows×V logits against integer targets, as PyTorch's
// F.cross_entropy computes it: log_softmax, then nll_loss with mean
// reduction and ignore_index −100.
//
//	logp = log_softmax(logits),  loss = −(1/N)·Σ_{rows r counted} logp[r, t_r]
//	dlogits[r] = (e^logp[r] − onehot(t_r))·dloss/N,  0 for ignored rows
//
// N is the number of rows whose target is not −100 (all rows, in the
// usual case). Torch-eager keeps logp alone; the targets are a graph input.
//
// The backward runs in PyTorch's two steps, and holds what they hold:
// nll_loss's backward writes the gradient of logp (−dloss/N at each
// target, 0 elsewhere) into a rows×vocab buffer of its own, and
// log_softmax's backward reads it beside logp to write dlogits. So the
// loss's backward holds, at its peak, logp, that gradient and dlogits: one
// logits-sized tensor more than the gradient alone.
package kernel

import (
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/exec/vmath"
)

// CrossEntropyIgnore is the target that marks a row out of the loss, as
// PyTorch's default ignore_index.
const CrossEntropyIgnore = -100

// lossCount returns the number of rows that count and panics on a target
// outside [0, vocab) other than CrossEntropyIgnore.
func lossCount(targets []int64, vocab int) int {
	n := 0
	for r, t := range targets {
		if t == CrossEntropyIgnore {
			continue
		}
		if t < 0 || t >= int64(vocab) {
			panic(fmt.Sprintf("kernel: cross_entropy: target %d of row %d is outside [0, %d)", t, r, vocab))
		}
		n++
	}
	return n
}

// CrossEntropy writes logp = log_softmax(logits) for the rows×vocab logits
// and returns the mean negative log-likelihood of the targets (rows
// values), summed in float64. Rows with target CrossEntropyIgnore do not
// count; when none counts the loss is NaN, as in PyTorch. It panics on any
// other target outside [0, vocab). O(rows·vocab).
func CrossEntropy(logp, logits []float32, targets []int64, rows, vocab int) float32 {
	pointwiseMustLen("cross_entropy", "logits", len(logits), rows*vocab)
	pointwiseMustLen("cross_entropy", "logp", len(logp), rows*vocab)
	pointwiseMustLen("cross_entropy", "targets", len(targets), rows)
	n := lossCount(targets, vocab)
	var s float64
	for r, t := range targets {
		lo, hi := r*vocab, (r+1)*vocab
		softmaxLogRow(logp[lo:hi], logits[lo:hi])
		if t != CrossEntropyIgnore {
			s -= float64(logp[lo+int(t)])
		}
	}
	if n == 0 {
		return float32(math.NaN())
	}
	return float32(s / float64(n))
}

// CrossEntropyBackwardScratch is the length of the scratch
// CrossEntropyBackward needs: the gradient of logp, rows·vocab.
func CrossEntropyBackwardScratch(rows, vocab int) int { return rows * vocab }

// CrossEntropyBackward writes dlogits = (e^logp − onehot(target))·dloss/N
// from the forward's logp and the targets, N being the rows that count;
// ignored rows get 0. As PyTorch, it first writes nll_loss's gradient of
// logp into dlogp (at least CrossEntropyBackwardScratch(rows, vocab)
// long), then log_softmax's backward from it: dlogits = dlogp −
// e^logp·Σ dlogp. With dlogp nil it writes dlogits directly, as a fused
// loss (Megatron's) does. O(rows·vocab).
func CrossEntropyBackward(dlogits, logp, dlogp []float32, targets []int64, dloss float32, rows, vocab int) {
	pointwiseMustLen("cross_entropy backward", "logp", len(logp), rows*vocab)
	pointwiseMustLen("cross_entropy backward", "dlogits", len(dlogits), rows*vocab)
	pointwiseMustLen("cross_entropy backward", "targets", len(targets), rows)
	n := lossCount(targets, vocab)
	g := float32(float64(dloss) / float64(n))
	if dlogp != nil {
		// nll_loss's backward.
		mmCheck("cross_entropy scratch", len(dlogp), CrossEntropyBackwardScratch(rows, vocab))
		dlogp = dlogp[:rows*vocab]
		clear(dlogp)
		for r, t := range targets {
			if t != CrossEntropyIgnore {
				dlogp[r*vocab+int(t)] = -g
			}
		}
	}
	// log_softmax's backward: a counted row's dlogp sums to −g, an
	// ignored row's to 0.
	for r, t := range targets {
		lo, hi := r*vocab, (r+1)*vocab
		dr := dlogits[lo:hi]
		if t == CrossEntropyIgnore {
			clear(dr)
			continue
		}
		vmath.Exp(dr, logp[lo:hi])
		for j := range dr {
			dr[j] *= g
		}
		if dlogp == nil {
			dr[t] -= g
			continue
		}
		dp := dlogp[lo:hi]
		for j := range dr {
			dr[j] += dp[j]
		}
	}
}
