// Scaled dot-product attention with grouped-query heads. For query head h of
// a batch entry, with key/value head g = h/(heads/kvheads), scale c = 1/√d
// and causal masking (key j visible to query i when j ≤ i):
//
//	S = c·Q_h·K_gᵀ,  P = softmax_rows(S),  O_h = (P ⊙ M)·V_g,
//
// where M is an optional dropout mask holding the scaled keep mask (0 or
// 1/(1-p)). With D = rowsum(∂O ⊙ O) = rowsum(P ⊙ (∂O·V_gᵀ ⊙ M)):
//
//	∂V_g += (P ⊙ M)ᵀ·∂O_h,  ∂S = P ⊙ (M ⊙ ∂O_h·V_gᵀ - D),
//	∂Q_h = c·∂S·K_g,  ∂K_g += c·∂Sᵀ·Q_h,
//
// the sums over the heads of a group taken in ascending head order.
//
// The eager kernels keep the probabilities P (and with dropout P ⊙ M),
// O(s²) per head. The flash kernels (Dao et al. 2022, FlashAttention:
// Fast and Memory-Efficient Exact Attention with IO-Awareness) tile the
// keys with an online softmax, keep only the output and the row
// log-sum-exp L = max S + log Σ exp(S - max S), and recompute P = exp(S - L)
// tile by tile in the backward.

package kernel

import (
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/stage/scratch"
)

// AttnShape gives the sizes of an attention: q and the output are
// [Batch, Heads, Seq, Dim], k and v [Batch, KVHeads, Seq, Dim], the
// probabilities and a dropout mask [Batch, Heads, Seq, Seq]. A KVHeads of 0
// means Heads; otherwise it must divide Heads. Causal hides key j from
// query i when j > i.
type AttnShape struct {
	Batch, Heads, KVHeads, Seq, Dim int
	Causal                          bool
}

// kv is the number of key/value heads.
func (sh AttnShape) kv() int {
	if sh.KVHeads == 0 {
		return sh.Heads
	}
	return sh.KVHeads
}

// group is how many query heads share one key/value head.
func (sh AttnShape) group() int {
	kv := sh.kv()
	if kv <= 0 || sh.Heads%kv != 0 {
		panic(fmt.Sprintf("kernel: %d kv heads do not divide %d heads", kv, sh.Heads))
	}
	return sh.Heads / kv
}

// scale is 1/√d in float32, applied to Q·Kᵀ after the product.
func (sh AttnShape) scale() float32 {
	return float32(1 / math.Sqrt(float64(sh.Dim)))
}

// visible is how many of the keys j0, j0+1, …, j0+width-1 query i sees.
func (sh AttnShape) visible(i, j0, width int) int {
	if !sh.Causal {
		return width
	}
	return max(0, min(width, i+1-j0))
}

// attnHead locates head n (batch entry n/Heads) and its key/value head.
type attnHead struct {
	q, kv int  // matrix indices into q-shaped and kv-shaped tensors
	first bool // the first query head of its group, which writes ∂K and ∂V
}

// head returns the indices for query head n < Batch·Heads.
func (sh AttnShape) head(n int) attnHead {
	rep := sh.group()
	b, h := n/sh.Heads, n%sh.Heads
	return attnHead{q: n, kv: b*sh.kv() + h/rep, first: h%rep == 0}
}

// check panics when a tensor is too small; nil tensors are skipped.
func (sh AttnShape) check(what string, t []float32, perHead int, kvShaped bool) {
	if t == nil {
		return
	}
	heads := sh.Heads
	if kvShaped {
		heads = sh.kv()
	}
	mmCheck(what, len(t), sh.Batch*heads*perHead)
}

// attnRole is one of the tensors the attention kernels take; it fixes the
// tensor's shape, so every kernel checks its tensors through checkAll.
type attnRole int

const (
	attnDQ attnRole = iota
	attnDK
	attnDV
	attnQ
	attnK
	attnV
	attnOut
	attnLSE
	attnDOut
	attnProbs
	attnMask
	attnDropped
	attnRoles
)

// attnRoleNames name the roles in length panics.
var attnRoleNames = [attnRoles]string{
	"attention dq", "attention dk", "attention dv", "attention q", "attention k", "attention v",
	"attention out", "attention lse", "attention dout", "attention probs", "attention mask", "attention dropped",
}

// attnArgs holds a kernel's tensors by role; the roles it lacks are nil.
type attnArgs [attnRoles][]float32

// checkAll checks every tensor of ts in role order: q-shaped and kv-shaped
// ones hold s·d values a head, lse s, and the probabilities, the dropout
// mask and the dropped probabilities s·s.
func (sh AttnShape) checkAll(ts attnArgs) {
	for r, t := range ts {
		perHead, kvShaped := sh.Seq*sh.Dim, false
		switch attnRole(r) {
		case attnDK, attnDV, attnK, attnV:
			kvShaped = true
		case attnLSE:
			perHead = sh.Seq
		case attnProbs, attnMask, attnDropped:
			perHead = sh.Seq * sh.Seq
		}
		sh.check(attnRoleNames[r], t, perHead, kvShaped)
	}
}

// attnCheckDropout panics unless the eager kernels' mask and dropped are
// both given (dropout) or both nil.
func attnCheckDropout(mask, dropped []float32) {
	if (mask == nil) != (dropped == nil) {
		panic("kernel: attention mask and dropped must both be given or both be nil")
	}
}

// repeatKVShape is the shape of a repeat_kv or its backward, checked
// against its kv-shaped tensor kvT and its query-shaped tensor qT.
func repeatKVShape(kvName, qName string, kvT, qT []float32, batch, kv, heads, s, d int) AttnShape {
	sh := AttnShape{Batch: batch, Heads: heads, KVHeads: kv, Seq: s, Dim: d}
	sh.check(kvName, kvT, s*d, true)
	sh.check(qName, qT, s*d, false)
	return sh
}

// RepeatKV expands x [batch, kv, s, d] to y [batch, heads, s, d] by copying
// each key/value head to the heads/kv query heads of its group, as Hugging
// Face's repeat_kv does. It takes O(batch·heads·s·d) time.
func RepeatKV(y, x []float32, batch, kv, heads, s, d int) {
	sh := repeatKVShape("repeat_kv x", "repeat_kv y", x, y, batch, kv, heads, s, d)
	sd := s * d
	for n := 0; n < batch*heads; n++ {
		g := sh.head(n).kv
		copy(y[n*sd:(n+1)*sd], x[g*sd:(g+1)*sd])
	}
}

// RepeatKVBackward writes dx [batch, kv, s, d] as the sum of dy
// [batch, heads, s, d] over each group's heads, in ascending head order. It
// keeps nothing. It takes O(batch·heads·s·d) time.
func RepeatKVBackward(dx, dy []float32, batch, kv, heads, s, d int) {
	sh := repeatKVShape("repeat_kv dx", "repeat_kv dy", dx, dy, batch, kv, heads, s, d)
	sd := s * d
	for n := 0; n < batch*heads; n++ {
		hd := sh.head(n)
		dst, src := dx[hd.kv*sd:(hd.kv+1)*sd], dy[n*sd:(n+1)*sd]
		if hd.first {
			copy(dst, src)
			continue
		}
		for i, g := range src {
			dst[i] += g
		}
	}
}

// Attention is the eager fused attention. It writes out [b, a, s, d] and
// probs [b, a, s, s] (the softmax, zero where causally hidden), and with a
// dropout mask (the scaled keep mask, [b, a, s, s]; nil without dropout)
// dropped = probs ⊙ mask, which the output is computed from. dropped must be
// nil when mask is. probs and dropped are what torch-eager keeps, with q, k,
// v and mask. It takes O(b·a·s²·d) time.
func Attention(out, probs, dropped, q, k, v, mask []float32, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	ss, sd := s*s, s*d
	sh.checkAll(attnArgs{attnQ: q, attnK: k, attnV: v, attnOut: out,
		attnProbs: probs, attnMask: mask, attnDropped: dropped})
	attnCheckDropout(mask, dropped)
	c := sh.scale()
	for n := 0; n < sh.Batch*sh.Heads; n++ {
		hd := sh.head(n)
		p := probs[n*ss : (n+1)*ss]
		sgemm(false, true, s, s, d, q[n*sd:], d, k[hd.kv*sd:], d, p, s, false)
		for i := 0; i < s; i++ {
			attnSoftmax(p[i*s:(i+1)*s], sh.visible(i, 0, s), c)
		}
		if mask != nil {
			pd, m := dropped[n*ss:(n+1)*ss], mask[n*ss:(n+1)*ss]
			for j, pv := range p {
				pd[j] = pv * m[j]
			}
			p = pd
		}
		sgemm(false, false, s, d, s, p, s, v[hd.kv*sd:], d, out[n*sd:], d, false)
	}
}

// expShifted scales the first nv entries of row by c and replaces each
// with exp(entry − m), m the largest of them and of from; it returns m
// and the sum of the exponentials as rounded, taken in float64 in order.
func expShifted(row []float32, nv int, c, from float32) (m float32, sum float64) {
	m = from
	for j := range row[:nv] {
		row[j] *= c
		m = max(m, row[j])
	}
	for j, x := range row[:nv] {
		e := float32(math.Exp(float64(x) - float64(m)))
		row[j] = e
		sum += float64(e)
	}
	return m, sum
}

// attnSoftmax replaces the first nv entries of row with the softmax of
// c·row and zeroes the rest. The exponentials are taken in float64 and
// rounded before summing, in the order FlashAttention's tiles use, so the
// two kernels differ only by the online rescaling.
func attnSoftmax(row []float32, nv int, c float32) {
	_, sum := expShifted(row, nv, c, float32(math.Inf(-1)))
	for j, e := range row[:nv] {
		row[j] = float32(float64(e) / sum)
	}
	clear(row[nv:])
}

// AttentionBackwardScratch is the length of the scratch AttentionBackward
// takes: one s×s matrix.
func AttentionBackwardScratch(sh AttnShape) int {
	return scratch.AttentionBackward(sh.Seq)
}

// AttentionBackward writes dq, dk and dv from dout for Attention, using what
// torch-eager keeps: q, k, v, probs, and with dropout mask and dropped (both
// nil without). dk and dv sum the heads of each group. A nil dq, dk or dv is
// not computed; dv needs only probs (or dropped), dq needs k, and dk needs q.
// scratch holds at least AttentionBackwardScratch(sh) elements. It takes
// O(b·a·s²·d) time.
func AttentionBackward(dq, dk, dv, q, k, v, probs, mask, dropped, dout, scratch []float32, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	ss, sd := s*s, s*d
	sh.checkAll(attnArgs{attnDQ: dq, attnDK: dk, attnDV: dv, attnDOut: dout, attnProbs: probs})
	attnCheckDropout(mask, dropped)
	if dq != nil || dk != nil {
		mmCheck("attention scratch", len(scratch), AttentionBackwardScratch(sh))
	}
	for n := 0; n < sh.Batch*sh.Heads; n++ {
		hd := sh.head(n)
		p, do := probs[n*ss:(n+1)*ss], dout[n*sd:]
		if dv != nil {
			pd := p
			if dropped != nil {
				pd = dropped[n*ss : (n+1)*ss]
			}
			sgemm(true, false, s, d, s, pd, s, do, d, dv[hd.kv*sd:], d, !hd.first)
		}
		if dq == nil && dk == nil {
			continue
		}
		ds := scratch[:ss]
		sgemm(false, true, s, s, d, do, d, v[hd.kv*sd:], d, ds, s, false)
		var m []float32
		if mask != nil {
			m = mask[n*ss : (n+1)*ss]
		}
		for i := 0; i < s; i++ {
			nv := sh.visible(i, 0, s)
			var mi []float32
			if m != nil {
				mi = m[i*s : i*s+nv]
			}
			dot := attnRowDot(p[i*s:i*s+nv], ds[i*s:i*s+nv], mi)
			attnScoreGrad(ds[i*s:(i+1)*s], p[i*s:(i+1)*s], mi, nv, dot, sh.scale())
		}
		if dq != nil {
			sgemm(false, false, s, d, s, ds, s, k[hd.kv*sd:], d, dq[n*sd:], d, false)
		}
		if dk != nil {
			sgemm(true, false, s, d, s, ds, s, q[n*sd:], d, dk[hd.kv*sd:], d, !hd.first)
		}
	}
}

// attnRowDot is Σ_j p_j·(m_j·g_j), the softmax backward's row term
// (m nil means all ones), summed in float64.
func attnRowDot(p, g, m []float32) float32 {
	var dot float64
	for j, pv := range p {
		gv := g[j]
		if m != nil {
			gv *= m[j]
		}
		dot += float64(pv) * float64(gv)
	}
	return float32(dot)
}

// attnScoreGrad turns a row of ∂(P⊙M) into c·∂S: g_j ← c·p_j·(m_j·g_j - dot)
// for the nv visible keys, zero for the rest (m nil means all ones).
func attnScoreGrad(g, p, m []float32, nv int, dot, c float32) {
	for j := range g[:nv] {
		gv := g[j]
		if m != nil {
			gv *= m[j]
		}
		g[j] = p[j] * (gv - dot) * c
	}
	clear(g[nv:])
}
