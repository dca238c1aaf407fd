package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// attnCase is an attention's shape and dropout probability.
type attnCase struct {
	sh AttnShape
	p  float64
}

func (tc attnCase) String() string {
	sh := tc.sh
	return fmt.Sprintf("b%d_a%d_kv%d_s%d_d%d_causal%v_p%v", sh.Batch, sh.Heads, sh.KVHeads, sh.Seq, sh.Dim, sh.Causal, tc.p)
}

var attnCases = []attnCase{
	{AttnShape{Batch: 1, Heads: 1, KVHeads: 1, Seq: 1, Dim: 2, Causal: true}, 0},
	{AttnShape{Batch: 2, Heads: 4, KVHeads: 2, Seq: 5, Dim: 3, Causal: true}, 0},
	{AttnShape{Batch: 1, Heads: 3, KVHeads: 1, Seq: 7, Dim: 4}, 0},
	{AttnShape{Batch: 1, Heads: 2, Seq: 6, Dim: 5, Causal: true}, 0},
	{AttnShape{Batch: 2, Heads: 2, KVHeads: 2, Seq: 6, Dim: 5, Causal: true}, 0.3},
	{AttnShape{Batch: 1, Heads: 4, KVHeads: 1, Seq: 9, Dim: 2}, 0.2},
}

// attnTensors are an attention's inputs, outputs and kept tensors.
type attnTensors struct {
	q, k, v, mask, dout []float32
	out, probs, dropped []float32
}

// attnNew draws random inputs for tc; the mask is nil when p is 0.
func attnNew(rng *rand.Rand, tc attnCase) *attnTensors {
	sh := tc.sh
	nq, nkv, np := sh.Batch*sh.Heads*sh.Seq*sh.Dim, sh.Batch*sh.kv()*sh.Seq*sh.Dim, sh.Batch*sh.Heads*sh.Seq*sh.Seq
	// Scores of a few units make the softmax far from uniform.
	scale := func(x []float32) []float32 {
		for i := range x {
			x[i] *= 2
		}
		return x
	}
	at := &attnTensors{
		q: scale(mmRand(rng, nq)), k: scale(mmRand(rng, nkv)), v: mmRand(rng, nkv), dout: mmRand(rng, nq),
		out: mmNaN(nq), probs: mmNaN(np),
	}
	if tc.p > 0 {
		at.mask, at.dropped = mmMask(rng, np, tc.p), mmNaN(np)
	}
	return at
}

// attnRef is the attention in float64: the output, the probabilities and
// the row log-sum-exp of the scaled scores.
func attnRef(at *attnTensors, sh AttnShape) (out, probs, lse []float64) {
	s, d := sh.Seq, sh.Dim
	c := 1 / math.Sqrt(float64(d))
	for n := 0; n < sh.Batch*sh.Heads; n++ {
		g := sh.head(n).kv
		for i := 0; i < s; i++ {
			row := make([]float64, s)
			mx := math.Inf(-1)
			for j := 0; j < s; j++ {
				if sh.Causal && j > i {
					row[j] = math.Inf(-1)
					continue
				}
				for e := 0; e < d; e++ {
					row[j] += float64(at.q[(n*s+i)*d+e]) * float64(at.k[(g*s+j)*d+e])
				}
				row[j] *= c
				mx = max(mx, row[j])
			}
			var sum float64
			for j := range row {
				row[j] = math.Exp(row[j] - mx)
				sum += row[j]
			}
			lse = append(lse, mx+math.Log(sum))
			for j := range row {
				row[j] /= sum
			}
			probs = append(probs, row...)
			for e := 0; e < d; e++ {
				var o float64
				for j, p := range row {
					if at.mask != nil {
						p *= float64(at.mask[(n*s+i)*s+j])
					}
					o += p * float64(at.v[(g*s+j)*d+e])
				}
				out = append(out, o)
			}
		}
	}
	return out, probs, lse
}

func TestAttention(t *testing.T) {
	for _, tc := range attnCases {
		t.Run(tc.String(), func(t *testing.T) {
			rng := mmRng(40)
			at := attnNew(rng, tc)
			Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, tc.sh)
			out, probs, _ := attnRef(at, tc.sh)
			mmClose(t, "out", at.out, out, 1e-5)
			mmClose(t, "probs", at.probs, probs, 1e-5)
			if at.mask != nil {
				for i, p := range at.probs {
					if at.dropped[i] != p*at.mask[i] {
						t.Fatalf("dropped[%d] = %v, want %v", i, at.dropped[i], p*at.mask[i])
					}
				}
			}

			dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
			scratch := mmNaN(AttentionBackwardScratch(tc.sh))
			mmGradCheck(t, rng, at.out,
				func() { Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, tc.sh) },
				func(dout []float32) {
					AttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.probs, at.mask, at.dropped, dout, scratch, tc.sh)
				},
				mmGrad{name: "q", x: at.q, grad: dq}, mmGrad{name: "k", x: at.k, grad: dk}, mmGrad{name: "v", x: at.v, grad: dv})
		})
	}
}

// attnTiles are the flash tile sizes the tests force: more than one tile,
// tiles that do not divide the sequence, and a single tile.
var attnTiles = [][2]int{{2, 3}, {3, 2}, {4, 4}, {64, 64}}

// attnWithTiles runs f with the flash tiles set to tiles.
func attnWithTiles(tiles [2]int, f func()) {
	q, k := flashTileQ, flashTileK
	defer func() { flashTileQ, flashTileK = q, k }()
	flashTileQ, flashTileK = tiles[0], tiles[1]
	f()
}

func TestFlashAttention(t *testing.T) {
	cases := append(attnCases, attnCase{AttnShape{Batch: 1, Heads: 2, KVHeads: 1, Seq: 130, Dim: 8, Causal: true}, 0})
	for _, tc := range cases {
		for _, tiles := range attnTiles {
			t.Run(fmt.Sprintf("%v/tiles%dx%d", tc, tiles[0], tiles[1]), func(t *testing.T) {
				attnWithTiles(tiles, func() { attnCheckFlash(t, tc) })
			})
		}
	}
}

// attnCheckFlash holds the flash kernels to the eager ones: outputs within
// 1e-5 and gradients within 1e-4 relative, and lse to the float64 reference.
func attnCheckFlash(t *testing.T, tc attnCase) {
	sh := tc.sh
	rng := mmRng(41)
	at := attnNew(rng, tc)
	Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, sh)
	out, lse := mmNaN(len(at.out)), mmNaN(sh.Batch*sh.Heads*sh.Seq)
	FlashAttention(out, lse, at.q, at.k, at.v, at.mask, mmNaN(FlashAttentionScratch(sh)), sh)
	mmClose(t, "out", out, at.out, 1e-5)
	_, _, wantLSE := attnRef(at, sh)
	mmClose(t, "lse", lse, wantLSE, 1e-6)

	dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
	AttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.probs, at.mask, at.dropped, at.dout,
		make([]float32, AttentionBackwardScratch(sh)), sh)
	fq, fk, fv := mmNaN(len(at.q)), mmNaN(len(at.k)), mmNaN(len(at.v))
	FlashAttentionBackward(fq, fk, fv, at.q, at.k, at.v, out, lse, at.mask, at.dout,
		mmNaN(FlashAttentionBackwardScratch(sh)), sh)
	mmClose(t, "dq", fq, dq, 1e-4)
	mmClose(t, "dk", fk, dk, 1e-4)
	mmClose(t, "dv", fv, dv, 1e-4)
}

func TestFlashAttentionGrad(t *testing.T) {
	for _, tc := range attnCases {
		t.Run(tc.String(), func(t *testing.T) {
			attnWithTiles([2]int{2, 3}, func() {
				sh := tc.sh
				rng := mmRng(42)
				at := attnNew(rng, tc)
				lse := make([]float32, sh.Batch*sh.Heads*sh.Seq)
				fwd, bwd := make([]float32, FlashAttentionScratch(sh)), make([]float32, FlashAttentionBackwardScratch(sh))
				dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
				mmGradCheck(t, rng, at.out,
					func() { FlashAttention(at.out, lse, at.q, at.k, at.v, at.mask, fwd, sh) },
					func(dout []float32) {
						FlashAttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.out, lse, at.mask, dout, bwd, sh)
					},
					mmGrad{name: "q", x: at.q, grad: dq}, mmGrad{name: "k", x: at.k, grad: dk}, mmGrad{name: "v", x: at.v, grad: dv})
			})
		})
	}
}

func TestAttentionOptionalGrads(t *testing.T) {
	tc := attnCases[4]
	sh := tc.sh
	rng := mmRng(43)
	at := attnNew(rng, tc)
	Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, sh)
	lse := make([]float32, sh.Batch*sh.Heads*sh.Seq)
	fout := make([]float32, len(at.out))
	FlashAttention(fout, lse, at.q, at.k, at.v, at.mask, make([]float32, FlashAttentionScratch(sh)), sh)
	eager := func(dq, dk, dv []float32) {
		AttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.probs, at.mask, at.dropped, at.dout,
			make([]float32, AttentionBackwardScratch(sh)), sh)
	}
	flash := func(dq, dk, dv []float32) {
		FlashAttentionBackward(dq, dk, dv, at.q, at.k, at.v, fout, lse, at.mask, at.dout,
			make([]float32, FlashAttentionBackwardScratch(sh)), sh)
	}
	for name, backward := range map[string]func(dq, dk, dv []float32){"eager": eager, "flash": flash} {
		dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
		backward(dq, dk, dv)
		dq2, dk2, dv2 := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
		backward(dq2, nil, nil)
		backward(nil, dk2, nil)
		backward(nil, nil, dv2)
		if !mmSame(dq, dq2) || !mmSame(dk, dk2) || !mmSame(dv, dv2) {
			t.Errorf("%s: gradients computed alone differ from gradients computed together", name)
		}
	}
}

func TestAttentionAllocs(t *testing.T) {
	tc := attnCase{AttnShape{Batch: 2, Heads: 4, KVHeads: 2, Seq: 70, Dim: 8, Causal: true}, 0.1}
	sh := tc.sh
	at := attnNew(mmRng(44), tc)
	dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
	lse := make([]float32, sh.Batch*sh.Heads*sh.Seq)
	eager := make([]float32, AttentionBackwardScratch(sh))
	fwd, bwd := make([]float32, FlashAttentionScratch(sh)), make([]float32, FlashAttentionBackwardScratch(sh))
	mmAllocs(t, "Attention", func() { Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, sh) })
	mmAllocs(t, "AttentionBackward", func() {
		AttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.probs, at.mask, at.dropped, at.dout, eager, sh)
	})
	mmAllocs(t, "FlashAttention", func() { FlashAttention(at.out, lse, at.q, at.k, at.v, at.mask, fwd, sh) })
	mmAllocs(t, "FlashAttentionBackward", func() {
		FlashAttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.out, lse, at.mask, at.dout, bwd, sh)
	})
	y := make([]float32, len(at.q))
	mmAllocs(t, "RepeatKV", func() { RepeatKV(y, at.k, sh.Batch, sh.KVHeads, sh.Heads, sh.Seq, sh.Dim) })
	mmAllocs(t, "RepeatKVBackward", func() { RepeatKVBackward(dk, y, sh.Batch, sh.KVHeads, sh.Heads, sh.Seq, sh.Dim) })
}

func TestAttentionDeterministic(t *testing.T) {
	tc := attnCase{AttnShape{Batch: 1, Heads: 4, KVHeads: 2, Seq: 150, Dim: 16, Causal: true}, 0.1}
	sh := tc.sh
	run := func() [][]float32 {
		at := attnNew(mmRng(45), tc)
		Attention(at.out, at.probs, at.dropped, at.q, at.k, at.v, at.mask, sh)
		dq, dk, dv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
		AttentionBackward(dq, dk, dv, at.q, at.k, at.v, at.probs, at.mask, at.dropped, at.dout,
			make([]float32, AttentionBackwardScratch(sh)), sh)
		out, lse := make([]float32, len(at.out)), make([]float32, sh.Batch*sh.Heads*sh.Seq)
		FlashAttention(out, lse, at.q, at.k, at.v, at.mask, make([]float32, FlashAttentionScratch(sh)), sh)
		fq, fk, fv := make([]float32, len(at.q)), make([]float32, len(at.k)), make([]float32, len(at.v))
		FlashAttentionBackward(fq, fk, fv, at.q, at.k, at.v, out, lse, at.mask, at.dout,
			make([]float32, FlashAttentionBackwardScratch(sh)), sh)
		return [][]float32{at.out, at.probs, at.dropped, dq, dk, dv, out, lse, fq, fk, fv}
	}
	r1, r2 := run(), run()
	for i := range r1 {
		if !mmSame(r1[i], r2[i]) {
			t.Errorf("output %d differs between runs", i)
		}
	}
}

func TestRepeatKV(t *testing.T) {
	for _, tc := range []struct{ b, kv, heads, s, d int }{{1, 1, 1, 1, 1}, {2, 2, 6, 3, 5}, {1, 3, 3, 2, 4}, {2, 1, 4, 5, 3}} {
		t.Run(fmt.Sprintf("b%d_kv%d_a%d_s%d_d%d", tc.b, tc.kv, tc.heads, tc.s, tc.d), func(t *testing.T) {
			rng := mmRng(46)
			sd := tc.s * tc.d
			x, y := mmRand(rng, tc.b*tc.kv*sd), mmNaN(tc.b*tc.heads*sd)
			RepeatKV(y, x, tc.b, tc.kv, tc.heads, tc.s, tc.d)
			rep := tc.heads / tc.kv
			for b := 0; b < tc.b; b++ {
				for h := 0; h < tc.heads; h++ {
					g := b*tc.kv + h/rep
					if n := b*tc.heads + h; !mmSame(y[n*sd:(n+1)*sd], x[g*sd:(g+1)*sd]) {
						t.Fatalf("batch %d head %d is not kv head %d", b, h, h/rep)
					}
				}
			}
			dx := make([]float32, len(x))
			mmGradCheck(t, rng, y,
				func() { RepeatKV(y, x, tc.b, tc.kv, tc.heads, tc.s, tc.d) },
				func(dy []float32) { RepeatKVBackward(dx, dy, tc.b, tc.kv, tc.heads, tc.s, tc.d) },
				mmGrad{name: "x", x: x, grad: dx})
		})
	}
}

func TestAttentionBadHeads(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for 3 kv heads of 4 heads")
		}
	}()
	sh := AttnShape{Batch: 1, Heads: 4, KVHeads: 3, Seq: 2, Dim: 2}
	Attention(make([]float32, 16), make([]float32, 16), nil, make([]float32, 16), make([]float32, 12), make([]float32, 12), nil, sh)
}
