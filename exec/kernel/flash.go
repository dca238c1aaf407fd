package kernel

import (
	"math"

	"github.com/ckptplan/ckptplan/stage/scratch"
)

// Flash attention (Dao et al. 2022, FlashAttention): the forward walks the
// keys in tiles with an online softmax and keeps only the output and the
// log-sum-exp of each row; the backward recomputes the probabilities tile by
// tile. No buffer larger than one tile of scores is ever held.

// The flash kernels' tile sizes: queries and keys per tile (package
// scratch's). A variable so tests can force many tiles on small
// sequences; the scratch functions read it, so a scratch sized after a
// change is sized right.
var flashTileQ, flashTileK = scratch.FlashTileQ, scratch.FlashTileK

// flashTiles returns the tile sizes clamped to the sequence.
func (sh AttnShape) flashTiles() (bq, bk int) {
	return min(flashTileQ, sh.Seq), min(flashTileK, sh.Seq)
}

// FlashAttentionScratch is the length of the scratch FlashAttention takes:
// one score tile and the running maximum and sum of a query tile,
// O(tile²), independent of the sequence beyond the tile.
func FlashAttentionScratch(sh AttnShape) int {
	return scratch.Flash(sh.flashTiles())
}

// FlashAttention writes out [b, a, s, d] and lse [b, a, s], the log-sum-exp
// of each row of scaled scores, which torch-eager's flash attention keeps
// with q, k, v and out; it never holds more than one tile of scores. mask is
// nil without dropout, else the scaled keep mask indexed [b, a, s, s] like
// Attention's, filled by the caller, which must pass the same mask to the
// backward. scratch holds at least FlashAttentionScratch(sh) elements. It
// takes O(b·a·s²·d) time.
func FlashAttention(out, lse, q, k, v, mask, scratch []float32, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	sd := s * d
	sh.checkAll(attnArgs{attnQ: q, attnK: k, attnV: v, attnOut: out, attnLSE: lse, attnMask: mask})
	mmCheck("flash scratch", len(scratch), FlashAttentionScratch(sh))
	bq, _ := sh.flashTiles()
	for n := 0; n < sh.Batch*sh.Heads; n++ {
		hd := sh.head(n)
		var m []float32
		if mask != nil {
			m = mask[n*s*s : (n+1)*s*s]
		}
		for i0 := 0; i0 < s; i0 += bq {
			br := min(bq, s-i0)
			flashForwardTile(out[n*sd+i0*d:n*sd+(i0+br)*d], lse[n*s+i0:n*s+i0+br],
				q[n*sd+i0*d:], k[hd.kv*sd:], v[hd.kv*sd:], m, scratch, i0, br, sh)
		}
	}
}

// flashForwardTile computes the output rows i0..i0+br-1 of one head by
// sweeping the key tiles, keeping per row the running maximum mx and sum l
// of exp(S - mx); o accumulates Σ exp(S - mx)·M·V and is rescaled whenever
// mx grows, then divided by l at the end.
func flashForwardTile(o, lse, q, k, v, mask, scratch []float32, i0, br int, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	bq, bk := sh.flashTiles()
	st := scratch[:bq*bk]
	mx, l := scratch[bq*bk:bq*bk+br], scratch[bq*bk+bq:bq*bk+bq+br]
	for r := range mx {
		mx[r], l[r] = float32(math.Inf(-1)), 0
	}
	clear(o)
	jEnd := s
	if sh.Causal {
		jEnd = i0 + br
	}
	c := sh.scale()
	for j0 := 0; j0 < jEnd; j0 += bk {
		bc := min(bk, s-j0)
		t := st[:br*bc]
		sgemm(false, true, br, bc, d, q, d, k[j0*d:], d, t, bc, false)
		for r := 0; r < br; r++ {
			i := i0 + r
			row := t[r*bc : (r+1)*bc]
			nv := sh.visible(i, j0, bc)
			alpha := flashOnline(row, nv, c, &mx[r], &l[r])
			if alpha != 1 {
				for e := range o[r*d : (r+1)*d] {
					o[r*d+e] *= alpha
				}
			}
			if mask != nil {
				for j, mv := range mask[i*s+j0 : i*s+j0+nv] {
					row[j] *= mv
				}
			}
		}
		sgemm(false, false, br, d, bc, t, bc, v[j0*d:], d, o, d, true)
	}
	for r := 0; r < br; r++ {
		for e := range o[r*d : (r+1)*d] {
			o[r*d+e] /= l[r]
		}
		lse[r] = float32(float64(mx[r]) + math.Log(float64(l[r])))
	}
}

// flashOnline folds one tile row of raw scores into a row's running maximum
// and sum: it overwrites the nv visible entries with exp(c·S - max), zeroes
// the rest, and returns the factor the row's earlier output must be scaled
// by (1 when the maximum did not move or nothing is visible).
func flashOnline(row []float32, nv int, c float32, mx, l *float32) float32 {
	if nv <= 0 {
		clear(row)
		return 1
	}
	m, sum := expShifted(row, nv, c, *mx)
	clear(row[nv:])
	alpha := float32(1)
	if m != *mx {
		alpha = float32(math.Exp(float64(*mx) - float64(m)))
	}
	*l = float32(float64(*l)*float64(alpha) + sum)
	*mx = m
	return alpha
}

// FlashAttentionBackwardScratch is the length of the scratch
// FlashAttentionBackward takes: two tiles and one value per query row.
func FlashAttentionBackwardScratch(sh AttnShape) int {
	bq, bk := sh.flashTiles()
	return scratch.FlashBackward(bq, bk, sh.Seq)
}

// FlashAttentionBackward writes dq, dk and dv from dout for FlashAttention,
// using what torch-eager keeps for flash attention: q, k, v, out and lse
// (plus the dropout mask the forward used, nil without dropout). It
// recomputes the probabilities one tile at a time; dk and dv sum the heads
// of each group. A nil dq, dk or dv is not computed. scratch holds at least
// FlashAttentionBackwardScratch(sh) elements. It takes O(b·a·s²·d) time,
// about 2.5 times the forward's products.
func FlashAttentionBackward(dq, dk, dv, q, k, v, out, lse, mask, dout, scratch []float32, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	sd := s * d
	sh.checkAll(attnArgs{attnDQ: dq, attnDK: dk, attnDV: dv, attnQ: q, attnK: k, attnV: v,
		attnOut: out, attnLSE: lse, attnDOut: dout, attnMask: mask})
	if dq == nil && dk == nil && dv == nil {
		return
	}
	mmCheck("flash scratch", len(scratch), FlashAttentionBackwardScratch(sh))
	for n := 0; n < sh.Batch*sh.Heads; n++ {
		hd := sh.head(n)
		t := flashHead{
			q: q[n*sd : (n+1)*sd], k: k[hd.kv*sd : (hd.kv+1)*sd], v: v[hd.kv*sd : (hd.kv+1)*sd],
			dout: dout[n*sd : (n+1)*sd], lse: lse[n*s : (n+1)*s],
		}
		if mask != nil {
			t.mask = mask[n*s*s : (n+1)*s*s]
		}
		if dq != nil {
			t.dq = dq[n*sd : (n+1)*sd]
			clear(t.dq)
		}
		if dk != nil {
			t.dk = dk[hd.kv*sd : (hd.kv+1)*sd]
			if hd.first {
				clear(t.dk)
			}
		}
		if dv != nil {
			t.dv = dv[hd.kv*sd : (hd.kv+1)*sd]
			if hd.first {
				clear(t.dv)
			}
		}
		flashBackwardHead(&t, out[n*sd:(n+1)*sd], scratch, sh)
	}
}

// flashHead is one head's slices of the backward's tensors; a nil gradient
// is not computed.
type flashHead struct {
	q, k, v, dout, lse, mask []float32
	dq, dk, dv               []float32
}

// flashBackwardHead adds one query head's share to dq, dk and dv, key tile
// by key tile (outer) and query tile by query tile (inner), as
// FlashAttention-2's backward orders them.
func flashBackwardHead(t *flashHead, out, scratch []float32, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	bq, bk := sh.flashTiles()
	dd := scratch[2*bq*bk : 2*bq*bk+s]
	for i := range dd {
		dd[i] = flashRowDot(t.dout[i*d:(i+1)*d], out[i*d:(i+1)*d])
	}
	for j0 := 0; j0 < s; j0 += bk {
		bc := min(bk, s-j0)
		iStart := 0
		if sh.Causal {
			// Query tiles wholly above the diagonal see none of these keys.
			iStart = j0 / bq * bq
		}
		for i0 := iStart; i0 < s; i0 += bq {
			br := min(bq, s-i0)
			flashBackwardTile(t, dd, scratch[:br*bc], scratch[bq*bk:bq*bk+br*bc], i0, br, j0, bc, sh)
		}
	}
}

// flashRowDot is Σ_e a_e·b_e in float64: D = rowsum(∂O ⊙ O).
func flashRowDot(a, b []float32) float32 {
	var dot float64
	for e, av := range a {
		dot += float64(av) * float64(b[e])
	}
	return float32(dot)
}

// flashBackwardTile handles the br×bc tile of query rows i0.. and key rows
// j0..: it recomputes P = exp(c·S - lse), turns ∂O·Vᵀ into c·∂S in ds, and
// adds the tile's products to dv, dq and dk.
func flashBackwardTile(t *flashHead, dd, p, ds []float32, i0, br, j0, bc int, sh AttnShape) {
	s, d := sh.Seq, sh.Dim
	c := sh.scale()
	sgemm(false, true, br, bc, d, t.q[i0*d:], d, t.k[j0*d:], d, p, bc, false)
	for r := 0; r < br; r++ {
		i := i0 + r
		row := p[r*bc : (r+1)*bc]
		nv := sh.visible(i, j0, bc)
		for j, x := range row[:nv] {
			row[j] = float32(math.Exp(float64(x*c) - float64(t.lse[i])))
		}
		clear(row[nv:])
	}
	if t.dq != nil || t.dk != nil {
		sgemm(false, true, br, bc, d, t.dout[i0*d:], d, t.v[j0*d:], d, ds, bc, false)
		for r := 0; r < br; r++ {
			i := i0 + r
			nv := sh.visible(i, j0, bc)
			var m []float32
			if t.mask != nil {
				m = t.mask[i*s+j0 : i*s+j0+nv]
			}
			attnScoreGrad(ds[r*bc:(r+1)*bc], p[r*bc:(r+1)*bc], m, nv, dd[i], c)
		}
	}
	if t.dv != nil {
		if t.mask != nil {
			for r := 0; r < br; r++ {
				i := i0 + r
				for j := range p[r*bc : (r+1)*bc] {
					p[r*bc+j] *= t.mask[i*s+j0+j]
				}
			}
		}
		sgemm(true, false, bc, d, br, p, bc, t.dout[i0*d:], d, t.dv[j0*d:], d, true)
	}
	if t.dq != nil {
		sgemm(false, false, br, d, bc, ds, bc, t.k[j0*d:], d, t.dq[i0*d:], d, true)
	}
	if t.dk != nil {
		sgemm(true, false, bc, d, br, ds, bc, t.q[i0*d:], d, t.dk[j0*d:], d, true)
	}
}
