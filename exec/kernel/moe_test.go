package kernel

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// moeCase is a mixture-of-experts layer's shape: T tokens of width h, E
// experts, k a token. A nil idx is drawn at random, k distinct experts a
// token; a given one picks which experts go without tokens.
type moeCase struct {
	tokens, experts, k, h int
	idx                   []int64
}

var moeCases = []moeCase{
	{tokens: 1, experts: 1, k: 1, h: 1},
	{tokens: 3, experts: 3, k: 2, h: 4, idx: []int64{0, 2, 2, 1, 0, 1}},
	{tokens: 5, experts: 4, k: 1, h: 3},
	{tokens: 4, experts: 3, k: 1, h: 5, idx: []int64{2, 0, 2, 0}}, // expert 1 idle
	{tokens: 6, experts: 5, k: 2, h: 3, idx: []int64{4, 0, 0, 4, 3, 0, 0, 3, 4, 3, 3, 4}},
	{tokens: 7, experts: 8, k: 2, h: 6},
	{tokens: 6, experts: 4, k: 4, h: 2},
	{tokens: 13, experts: 6, k: 3, h: 7},
}

func (c moeCase) String() string {
	return fmt.Sprintf("T%d_E%d_k%d_h%d", c.tokens, c.experts, c.k, c.h)
}

// moeEachCase runs f as a subtest on each of moeCases, with a generator
// seeded by the case's place in the list.
func moeEachCase(t *testing.T, f func(t *testing.T, rng *rand.Rand, c moeCase)) {
	for i, c := range moeCases {
		t.Run(c.String(), func(t *testing.T) {
			f(t, rand.New(rand.NewSource(int64(i+1))), c)
		})
	}
}

// moeIdx is the case's idx, or k distinct random experts for every token.
func moeIdx(rng *rand.Rand, c moeCase) []int64 {
	if c.idx != nil {
		return c.idx
	}
	idx := make([]int64, c.tokens*c.k)
	for t := range c.tokens {
		for j, e := range rng.Perm(c.experts)[:c.k] {
			idx[t*c.k+j] = int64(e)
		}
	}
	return idx
}

// moeRoute runs Route on a case's idx.
func moeRoute(c moeCase, idx []int64) (route []int64, counts []int) {
	route, counts = make([]int64, 2*c.tokens*c.k), make([]int, c.experts)
	Route(route, counts, idx, c.tokens, c.k, c.experts)
	return route, counts
}

// moeRefRoute is the rule, literally: experts, then slots, then tokens.
func moeRefRoute(idx []int64, tokens, k, experts int) (route []int64, counts []int) {
	counts = make([]int, experts)
	for e := range experts {
		for j := range k {
			for t := range tokens {
				if idx[t*k+j] == int64(e) {
					route = append(route, int64(j), int64(t))
					counts[e]++
				}
			}
		}
	}
	return route, counts
}

// moeRefTopK picks, k times, the largest value not yet picked and the
// lowest column among equals.
func moeRefTopK(x []float64, rows, n, k int) (vals []float64, idx []int64) {
	for r := range rows {
		taken := make([]bool, n)
		for range k {
			best := -1
			for c := range n {
				if !taken[c] && (best < 0 || x[r*n+c] > x[r*n+best]) {
					best = c
				}
			}
			taken[best] = true
			vals, idx = append(vals, x[r*n+best]), append(idx, int64(best))
		}
	}
	return vals, idx
}

func TestMoERouteExample(t *testing.T) {
	// Tokens pick [[0,2],[2,1],[0,1]]. Expert 0: slot 0 of tokens 0 and 2.
	// Expert 1: slot 1 of tokens 1 and 2. Expert 2: slot 0 of token 1, then
	// slot 1 of token 0 (slot before token).
	idx := []int64{0, 2, 2, 1, 0, 1}
	route, counts := make([]int64, 12), make([]int, 3)
	Route(route, counts, idx, 3, 2, 3)
	want := []int64{0, 0, 0, 2, 1, 1, 1, 2, 0, 1, 1, 0}
	if !slices.Equal(route, want) || !slices.Equal(counts, []int{2, 2, 2}) {
		t.Errorf("route %v counts %v, want %v and [2 2 2]", route, counts, want)
	}
}

func TestRoute(t *testing.T) {
	cases := append(slices.Clone(moeCases),
		moeCase{tokens: 9, experts: 5, k: 2, idx: []int64{0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4}},
		moeCase{tokens: 0, experts: 3, k: 2},
		moeCase{tokens: 4, experts: 3, k: 2, idx: []int64{1, 1, 1, 1, 1, 1, 1, 1}}, // repeats: Route does not need distinct experts
	)
	for i, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(i + 1)))
			idx := moeIdx(rng, c)
			route, counts := moeRoute(c, idx)
			wantRoute, wantCounts := moeRefRoute(idx, c.tokens, c.k, c.experts)
			if !slices.Equal(route, wantRoute) {
				t.Errorf("route %v, want %v", route, wantRoute)
			}
			if !slices.Equal(counts, wantCounts) {
				t.Errorf("counts %v, want %v", counts, wantCounts)
			}
			mmAllocs(t, "Route", func() { Route(route, counts, idx, c.tokens, c.k, c.experts) })
		})
	}
}

func TestTopK(t *testing.T) {
	for i, s := range []struct{ rows, n, k int }{
		{1, 1, 1}, {3, 5, 1}, {4, 5, 2}, {2, 8, 8}, {5, 13, 3}, {3, 64, 2},
	} {
		t.Run(fmt.Sprintf("%dx%d_k%d", s.rows, s.n, s.k), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(i + 1)))
			// Continuous values, then values on a grid of 5, full of ties.
			for _, ties := range []bool{false, true} {
				x := fdRand(rng, s.rows*s.n, -1, 1)
				if ties {
					for j, v := range x {
						x[j] = float32(math.Round(float64(v)*2)) / 2
					}
				}
				vals, idx := mmNaN(s.rows*s.k), slices.Repeat([]int64{-9}, s.rows*s.k)
				TopK(vals, idx, x, s.rows, s.n, s.k)
				wv, wi := moeRefTopK(fdWiden(x), s.rows, s.n, s.k)
				if !slices.Equal(idx, wi) {
					t.Errorf("ties %v: idx %v, want %v", ties, idx, wi)
				}
				fdCheck(t, "vals", wv, vals, 0)
			}

			x := fdRand(rng, s.rows*s.n, -1, 1)
			vals, idx := make([]float32, s.rows*s.k), make([]int64, s.rows*s.k)
			TopK(vals, idx, x, s.rows, s.n, s.k)
			g := fdRand(rng, s.rows*s.k, -1, 1)
			dx := mmNaN(s.rows * s.n) // written everywhere
			TopKBackward(dx, g, idx, s.rows, s.n, s.k)
			fdGradCheck(t, "dx", func(v []float64) float64 {
				vv, _ := moeRefTopK(v, s.rows, s.n, s.k)
				return fdDot(vv, g)
			}, x, dx)
			mmAllocs(t, "TopK", func() { TopK(vals, idx, x, s.rows, s.n, s.k) })
			mmAllocs(t, "TopKBackward", func() { TopKBackward(dx, g, idx, s.rows, s.n, s.k) })
		})
	}
}

func TestTopKTiesAndNaN(t *testing.T) {
	nan := float32(math.NaN())
	for _, c := range []struct {
		x    []float32
		k    int
		vals []float32
		idx  []int64
	}{
		{[]float32{1, 3, 3, 2}, 3, []float32{3, 3, 2}, []int64{1, 2, 3}},
		{[]float32{2, 2, 2, 2}, 2, []float32{2, 2}, []int64{0, 1}},
		{[]float32{0, -1, 5, 5}, 1, []float32{5}, []int64{2}},
		{[]float32{1, nan, 3, nan}, 3, []float32{nan, nan, 3}, []int64{1, 3, 2}},
	} {
		vals, idx := make([]float32, c.k), make([]int64, c.k)
		TopK(vals, idx, c.x, 1, len(c.x), c.k)
		if !slices.Equal(idx, c.idx) || !mmSame(vals, c.vals) {
			t.Errorf("topk %d of %v: %v at %v, want %v at %v", c.k, c.x, vals, idx, c.vals, c.idx)
		}
	}
}

// moeRefSumNorm is x/Σx row by row.
func moeRefSumNorm(x []float64, rows, k int) (y, sum []float64) {
	y, sum = make([]float64, rows*k), make([]float64, rows)
	for r := range rows {
		for _, v := range x[r*k : (r+1)*k] {
			sum[r] += v
		}
		for j, v := range x[r*k : (r+1)*k] {
			y[r*k+j] = v / sum[r]
		}
	}
	return y, sum
}

func TestSumNorm(t *testing.T) {
	for i, s := range []struct{ rows, k int }{{1, 1}, {3, 2}, {4, 4}, {2, 8}, {9, 3}} {
		t.Run(fmt.Sprintf("%dx%d", s.rows, s.k), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(i + 1)))
			n := s.rows * s.k
			// Top-k probabilities: positive, at most 1.
			x, g := fdRand(rng, n, 0.05, 1), fdRand(rng, n, -1, 1)
			y, sum, clone := mmNaN(n), mmNaN(s.rows), mmNaN(n)
			SumNorm(y, sum, clone, x, s.rows, s.k)
			wy, ws := moeRefSumNorm(fdWiden(x), s.rows, s.k)
			fdCheck(t, "y", wy, y, 1e-6)
			fdCheck(t, "sum", ws, sum, 1e-6)
			if !mmSame(clone, x) {
				t.Error("clone is not x")
			}

			// In place, as w /= w.sum(...) runs.
			w, sum2, clone2 := slices.Clone(x), mmNaN(s.rows), mmNaN(n)
			SumNorm(w, sum2, clone2, w, s.rows, s.k)
			if !mmSame(w, y) || !mmSame(sum2, sum) || !mmSame(clone2, x) {
				t.Error("in place differs")
			}

			dx := mmNaN(n)
			SumNormBackward(dx, g, clone, sum, s.rows, s.k)
			fdGradCheck(t, "dx", func(v []float64) float64 {
				yy, _ := moeRefSumNorm(v, s.rows, s.k)
				return fdDot(yy, g)
			}, x, dx)
			dg := slices.Clone(g)
			SumNormBackward(dg, dg, clone, sum, s.rows, s.k)
			if !mmSame(dg, dx) {
				t.Error("dx in place of dy differs")
			}
			mmAllocs(t, "SumNorm", func() { SumNorm(y, sum, clone, x, s.rows, s.k) })
			mmAllocs(t, "SumNormBackward", func() { SumNormBackward(dx, g, clone, sum, s.rows, s.k) })
		})
	}
}

// moeRefDispatch is y[r] = x[token(r)].
func moeRefDispatch(x []float64, route []int64, h int) []float64 {
	var y []float64
	for r := range len(route) / 2 {
		t := int(route[2*r+1])
		y = append(y, x[t*h:(t+1)*h]...)
	}
	return y
}

// moeRefCombine is y[token(r)] += x[r] over tokens×h.
func moeRefCombine(x []float64, route []int64, tokens, h int) []float64 {
	y := make([]float64, tokens*h)
	for r := range len(route) / 2 {
		t := int(route[2*r+1])
		for c := range h {
			y[t*h+c] += x[r*h+c]
		}
	}
	return y
}

func TestDispatchCombine(t *testing.T) {
	moeEachCase(t, func(t *testing.T, rng *rand.Rand, c moeCase) {
		route, _ := moeRoute(c, moeIdx(rng, c))
		rows, h := c.tokens*c.k, c.h
		x, gx := fdRand(rng, c.tokens*h, -1, 1), fdRand(rng, rows*h, -1, 1)
		xr, gt := fdRand(rng, rows*h, -1, 1), fdRand(rng, c.tokens*h, -1, 1)

		y := mmNaN(rows * h)
		Dispatch(y, x, route, rows, h)
		fdCheck(t, "dispatch", moeRefDispatch(fdWiden(x), route, h), y, 0)
		dx := mmNaN(c.tokens * h)
		DispatchBackward(dx, gx, route, c.tokens, rows, h)
		fdGradCheck(t, "dispatch dx", func(v []float64) float64 { return fdDot(moeRefDispatch(v, route, h), gx) }, x, dx)

		yt := mmNaN(c.tokens * h)
		Combine(yt, xr, route, c.tokens, rows, h)
		fdCheck(t, "combine", moeRefCombine(fdWiden(xr), route, c.tokens, h), yt, 1e-6)
		dxr := mmNaN(rows * h)
		CombineBackward(dxr, gt, route, rows, h)
		fdGradCheck(t, "combine dx", func(v []float64) float64 { return fdDot(moeRefCombine(v, route, c.tokens, h), gt) }, xr, dxr)

		mmAllocs(t, "Dispatch", func() { Dispatch(y, x, route, rows, h) })
		mmAllocs(t, "DispatchBackward", func() { DispatchBackward(dx, gx, route, c.tokens, rows, h) })
		mmAllocs(t, "Combine", func() { Combine(yt, xr, route, c.tokens, rows, h) })
		mmAllocs(t, "CombineBackward", func() { CombineBackward(dxr, gt, route, rows, h) })
	})
}

func TestCombineOrder(t *testing.T) {
	// Three rows of token 0 sum in row order, from zero: in float32,
	// (1e8 + 1) − 1e8 is 0, where another order would give 1.
	route := []int64{0, 0, 1, 0, 2, 0}
	x := []float32{1e8, 1, -1e8}
	for name, f := range map[string]func(y []float32){
		"combine":           func(y []float32) { Combine(y, x, route, 2, 3, 1) },
		"dispatch backward": func(y []float32) { DispatchBackward(y, x, route, 2, 3, 1) },
	} {
		y := []float32{7, 7}
		f(y)
		if !mmSame(y, []float32{0, 0}) {
			t.Errorf("%s: %v, want [0 0]", name, y)
		}
	}
}

// moeRefExpertLinear is y[r] = x[r]·w[e(r)] in float64.
func moeRefExpertLinear(x, w []float64, route, idx []int64, k, in, out int) []float64 {
	rows := len(route) / 2
	y := make([]float64, rows*out)
	for r := range rows {
		e := int(idx[route[2*r+1]*int64(k)+route[2*r]])
		for o := range out {
			for p := range in {
				y[r*out+o] += x[r*in+p] * w[e*in*out+p*out+o]
			}
		}
	}
	return y
}

func TestExpertLinear(t *testing.T) {
	moeEachCase(t, func(t *testing.T, rng *rand.Rand, c moeCase) {
		idx := moeIdx(rng, c)
		route, counts := moeRoute(c, idx)
		rows, in, out, E := c.tokens*c.k, c.h, c.h+2, c.experts
		x, w := fdRand(rng, rows*in, -1, 1), fdRand(rng, E*in*out, -1, 1)
		g := fdRand(rng, rows*out, -1, 1)

		y := mmNaN(rows * out)
		ExpertLinear(y, x, w, route, idx, c.k, E, in, out)
		fdCheck(t, "y", moeRefExpertLinear(fdWiden(x), fdWiden(w), route, idx, c.k, in, out), y, fdTol)

		dx, dw := mmNaN(rows*in), normFilled(E*in*out, 9)
		ExpertLinearBackward(dx, dw, g, x, w, route, idx, c.k, E, in, out)
		fdGradCheck(t, "dx", func(v []float64) float64 {
			return fdDot(moeRefExpertLinear(v, fdWiden(w), route, idx, c.k, in, out), g)
		}, x, dx)
		fdGradCheck(t, "dw", func(v []float64) float64 {
			return fdDot(moeRefExpertLinear(fdWiden(x), v, route, idx, c.k, in, out), g)
		}, w, normMinus(dw, 9))
		for e, n := range counts {
			if n == 0 && !mmSame(dw[e*in*out:(e+1)*in*out], normFilled(in*out, 9)) {
				t.Errorf("expert %d has no rows, but its dw changed", e)
			}
		}

		// One gradient at a time, with only what it reads.
		dx2, dw2 := mmNaN(rows*in), normFilled(E*in*out, 9)
		ExpertLinearBackward(dx2, nil, g, nil, w, route, idx, c.k, E, in, out)
		ExpertLinearBackward(nil, dw2, g, x, nil, route, idx, c.k, E, in, out)
		if !mmSame(dx, dx2) || !mmSame(dw, dw2) {
			t.Error("gradients computed alone differ")
		}
		mmAllocs(t, "ExpertLinear", func() { ExpertLinear(y, x, w, route, idx, c.k, E, in, out) })
		mmAllocs(t, "ExpertLinearBackward", func() { ExpertLinearBackward(dx, dw, g, x, w, route, idx, c.k, E, in, out) })
	})
}

// moeRefGather is y[r] = w[token(r)·k + slot(r)].
func moeRefGather(w []float64, route []int64, k int) []float64 {
	y := make([]float64, len(route)/2)
	for r := range y {
		y[r] = w[int(route[2*r+1])*k+int(route[2*r])]
	}
	return y
}

func TestGatherWeights(t *testing.T) {
	moeEachCase(t, func(t *testing.T, rng *rand.Rand, c moeCase) {
		route, _ := moeRoute(c, moeIdx(rng, c))
		rows := c.tokens * c.k
		w, g := fdRand(rng, c.tokens*c.k, 0, 1), fdRand(rng, rows, -1, 1)
		y := mmNaN(rows)
		GatherWeights(y, w, route, rows, c.k)
		fdCheck(t, "y", moeRefGather(fdWiden(w), route, c.k), y, 0)
		dw := mmNaN(c.tokens * c.k)
		GatherWeightsBackward(dw, g, route, c.tokens, rows, c.k)
		fdGradCheck(t, "dw", func(v []float64) float64 { return fdDot(moeRefGather(v, route, c.k), g) }, w, dw)
		mmAllocs(t, "GatherWeights", func() { GatherWeights(y, w, route, rows, c.k) })
		mmAllocs(t, "GatherWeightsBackward", func() { GatherWeightsBackward(dw, g, route, c.tokens, rows, c.k) })
	})
}

// moeRefMulRows is y[r,c] = a[r,c]·b[r].
func moeRefMulRows(a, b []float64, cols int) []float64 {
	y := make([]float64, len(a))
	for i, v := range a {
		y[i] = v * b[i/cols]
	}
	return y
}

func TestMulRows(t *testing.T) {
	fdEachShape(t, func(t *testing.T, rng *rand.Rand, rows, cols int) {
		a, b, g := fdRand(rng, rows*cols, -2, 2), fdRand(rng, rows, -2, 2), fdRand(rng, rows*cols, -1, 1)
		a64, b64 := fdWiden(a), fdWiden(b)
		y := mmNaN(rows * cols)
		MulRows(y, a, b, rows, cols)
		fdCheck(t, "y", moeRefMulRows(a64, b64, cols), y, 1e-6)
		ya := slices.Clone(a)
		MulRows(ya, ya, b, rows, cols)
		if !mmSame(ya, y) {
			t.Error("y in place of a differs")
		}

		da, db := mmNaN(rows*cols), mmNaN(rows)
		MulRowsBackward(da, db, g, a, b, rows, cols)
		fdGradCheck(t, "da", func(v []float64) float64 { return fdDot(moeRefMulRows(v, b64, cols), g) }, a, da)
		fdGradCheck(t, "db", func(v []float64) float64 { return fdDot(moeRefMulRows(a64, v, cols), g) }, b, db)

		da2, db2 := mmNaN(rows*cols), mmNaN(rows)
		MulRowsBackward(da2, nil, g, nil, b, rows, cols)
		MulRowsBackward(nil, db2, g, a, nil, rows, cols)
		if !mmSame(da, da2) || !mmSame(db, db2) {
			t.Error("gradients computed alone differ")
		}
		dg, db3 := slices.Clone(g), mmNaN(rows)
		MulRowsBackward(dg, db3, dg, a, b, rows, cols)
		if !mmSame(dg, da) || !mmSame(db3, db) {
			t.Error("da in place of dy differs")
		}
		mmAllocs(t, "MulRows", func() { MulRows(y, a, b, rows, cols) })
		mmAllocs(t, "MulRowsBackward", func() { MulRowsBackward(da, db, g, a, b, rows, cols) })
	})
}

// moeRefLayer is MixtralSparseMoeBlock's forward in float64, transcribed:
// softmax of the router logits, top-k, the weights divided by their sum,
// then expert by expert torch.where over (slot, token), the expert (here
// one linear, w[e] h×h) on its tokens times their weights, index_add_.
func moeRefLayer(x, logits, w []float64, tokens, experts, k, h int) []float64 {
	p := make([]float64, tokens*experts)
	for t := range tokens {
		lr := logits[t*experts : (t+1)*experts]
		m := slices.Max(lr)
		var s float64
		for e, v := range lr {
			p[t*experts+e] = math.Exp(v - m)
			s += p[t*experts+e]
		}
		for e := range lr {
			p[t*experts+e] /= s
		}
	}
	rw, sel := moeRefTopK(p, tokens, experts, k)
	rw, _ = moeRefSumNorm(rw, tokens, k)
	final := make([]float64, tokens*h)
	for e := range experts {
		for j := range k {
			for t := range tokens {
				if sel[t*k+j] != int64(e) {
					continue
				}
				for o := range h {
					var s float64
					for i := range h {
						s += x[t*h+i] * w[e*h*h+i*h+o]
					}
					final[t*h+o] += s * rw[t*k+j]
				}
			}
		}
	}
	return final
}

// TestMoELayer chains the kernels into Mixtral's sparse MoE block (with one
// linear an expert), forward and backward, against the float64 block and
// its finite differences in the hidden states, router logits and weights.
func TestMoELayer(t *testing.T) {
	for i, c := range moeCases {
		if c.idx != nil {
			continue
		}
		t.Run(c.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(i + 1)))
			T, E, k, h := c.tokens, c.experts, c.k, c.h
			R := T * k
			x, logits := fdRand(rng, T*h, -1, 1), fdRand(rng, T*E, -2, 2)
			w, gout := fdRand(rng, E*h*h, -1, 1), fdRand(rng, T*h, -1, 1)

			p, v, idx := make([]float32, T*E), make([]float32, R), make([]int64, R)
			wts, sum, clone := make([]float32, R), make([]float32, T), make([]float32, R)
			route, counts := make([]int64, 2*R), make([]int, E)
			xr, yr, g, z, out := make([]float32, R*h), make([]float32, R*h), make([]float32, R), make([]float32, R*h), make([]float32, T*h)
			Softmax(p, logits, T, E)
			TopK(v, idx, p, T, E, k)
			SumNorm(wts, sum, clone, v, T, k)
			Route(route, counts, idx, T, k, E)
			Dispatch(xr, x, route, R, h)
			ExpertLinear(yr, xr, w, route, idx, k, E, h, h)
			GatherWeights(g, wts, route, R, k)
			MulRows(z, yr, g, R, h)
			Combine(out, z, route, T, R, h)
			ref := func(x, logits, w []float64) []float64 { return moeRefLayer(x, logits, w, T, E, k, h) }
			x64, l64, w64 := fdWiden(x), fdWiden(logits), fdWiden(w)
			fdCheck(t, "out", ref(x64, l64, w64), out, fdTol)

			dz, dyr, dg, dwts := make([]float32, R*h), make([]float32, R*h), make([]float32, R), make([]float32, R)
			dxr, dw, dx := make([]float32, R*h), make([]float32, E*h*h), make([]float32, T*h)
			dv, dp, dlogits := make([]float32, R), make([]float32, T*E), make([]float32, T*E)
			CombineBackward(dz, gout, route, R, h)
			MulRowsBackward(dyr, dg, dz, yr, g, R, h)
			GatherWeightsBackward(dwts, dg, route, T, R, k)
			ExpertLinearBackward(dxr, dw, dyr, xr, w, route, idx, k, E, h, h)
			DispatchBackward(dx, dxr, route, T, R, h)
			SumNormBackward(dv, dwts, clone, sum, T, k)
			TopKBackward(dp, dv, idx, T, E, k)
			SoftmaxBackward(dlogits, p, dp, T, E)
			fdGradCheck(t, "dx", func(v []float64) float64 { return fdDot(ref(v, l64, w64), gout) }, x, dx)
			fdGradCheck(t, "dlogits", func(v []float64) float64 { return fdDot(ref(x64, v, w64), gout) }, logits, dlogits)
			fdGradCheck(t, "dw", func(v []float64) float64 { return fdDot(ref(x64, l64, v), gout) }, w, dw)
		})
	}
}

// moePanics fails unless f panics.
func moePanics(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", name)
		}
	}()
	f()
}

func TestMoEPanics(t *testing.T) {
	// T=3, k=2, E=3, h=2: R = 6 routed rows.
	idx := []int64{0, 2, 2, 1, 0, 1}
	route := []int64{0, 0, 0, 2, 1, 1, 1, 2, 0, 1, 1, 0}
	f := func(n int) []float32 { return make([]float32, n) }
	i64 := func(n int) []int64 { return make([]int64, n) }
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"topk k 0", func() { TopK(f(3), i64(3), f(9), 3, 3, 0) }},
		{"topk k > n", func() { TopK(f(12), i64(12), f(9), 3, 3, 4) }},
		{"topk short x", func() { TopK(f(6), i64(6), f(8), 3, 3, 2) }},
		{"topk short vals", func() { TopK(f(5), i64(6), f(9), 3, 3, 2) }},
		{"topk short idx", func() { TopK(f(6), i64(5), f(9), 3, 3, 2) }},
		{"topk backward short dx", func() { TopKBackward(f(8), f(6), idx, 3, 3, 2) }},
		{"topk backward index", func() { TopKBackward(f(9), f(6), []int64{0, 3, 0, 1, 0, 1}, 3, 3, 2) }},
		{"sumnorm short y", func() { SumNorm(f(5), f(3), f(6), f(6), 3, 2) }},
		{"sumnorm short sum", func() { SumNorm(f(6), f(2), f(6), f(6), 3, 2) }},
		{"sumnorm short clone", func() { SumNorm(f(6), f(3), f(5), f(6), 3, 2) }},
		{"sumnorm backward short dx", func() { SumNormBackward(f(5), f(6), f(6), f(3), 3, 2) }},
		{"route expert 3", func() { Route(i64(12), make([]int, 3), []int64{0, 2, 3, 1, 0, 1}, 3, 2, 3) }},
		{"route expert -1", func() { Route(i64(12), make([]int, 3), []int64{0, 2, 2, 1, -1, 1}, 3, 2, 3) }},
		{"route short route", func() { Route(i64(11), make([]int, 3), idx, 3, 2, 3) }},
		{"route short idx", func() { Route(i64(12), make([]int, 3), idx[:5], 3, 2, 3) }},
		{"route short counts", func() { Route(i64(12), make([]int, 2), idx, 3, 2, 3) }},
		{"expert linear odd route", func() { ExpertLinear(f(24), f(12), f(24), route[:11], idx, 2, 3, 2, 4) }},
		{"expert linear slot", func() { ExpertLinear(f(4), f(2), f(24), []int64{2, 0}, idx, 2, 3, 2, 4) }},
		{"expert linear token", func() { ExpertLinear(f(4), f(2), f(24), []int64{0, 3}, idx, 2, 3, 2, 4) }},
		{"dispatch short y", func() { Dispatch(f(11), f(6), route, 6, 2) }},
		{"dispatch token", func() { Dispatch(f(12), f(4), route, 6, 2) }},
		{"dispatch short route", func() { Dispatch(f(12), f(6), route[:10], 6, 2) }},
		{"dispatch backward short dx", func() { DispatchBackward(f(5), f(12), route, 3, 6, 2) }},
		{"dispatch backward token", func() { DispatchBackward(f(4), f(12), route, 2, 6, 2) }},
		{"combine short y", func() { Combine(f(5), f(12), route, 3, 6, 2) }},
		{"combine short x", func() { Combine(f(6), f(11), route, 3, 6, 2) }},
		{"combine backward short dx", func() { CombineBackward(f(11), f(6), route, 6, 2) }},
		{"expert linear short w", func() { ExpertLinear(f(24), f(12), f(23), route, idx, 2, 3, 2, 4) }},
		{"expert linear short x", func() { ExpertLinear(f(24), f(11), f(24), route, idx, 2, 3, 2, 4) }},
		{"expert linear short y", func() { ExpertLinear(f(23), f(12), f(24), route, idx, 2, 3, 2, 4) }},
		{"expert linear descending", func() {
			ExpertLinear(f(24), f(12), f(24), slices.Concat(route[8:], route[:8]), idx, 2, 3, 2, 4)
		}},
		{"expert linear split expert", func() {
			ExpertLinear(f(24), f(12), f(24), slices.Concat(route[:2], route[4:6], route[2:4], route[6:]), idx, 2, 3, 2, 4)
		}},
		{"expert linear expert", func() { ExpertLinear(f(24), f(12), f(16), route, idx, 2, 2, 2, 4) }},
		{"expert linear backward short dx", func() { ExpertLinearBackward(f(11), nil, f(24), nil, f(24), route, idx, 2, 3, 2, 4) }},
		{"expert linear backward short dw", func() { ExpertLinearBackward(nil, f(23), f(24), f(12), nil, route, idx, 2, 3, 2, 4) }},
		{"expert linear backward short dy", func() { ExpertLinearBackward(f(12), f(24), f(23), f(12), f(24), route, idx, 2, 3, 2, 4) }},
		{"gather weights short y", func() { GatherWeights(f(5), f(6), route, 6, 2) }},
		{"gather weights short w", func() { GatherWeights(f(6), f(5), route, 6, 2) }},
		{"gather weights slot", func() { GatherWeights(f(6), f(6), route, 6, 1) }},
		{"gather weights backward short dw", func() { GatherWeightsBackward(f(5), f(6), route, 3, 6, 2) }},
		{"mulrows short b", func() { MulRows(f(6), f(6), f(2), 3, 2) }},
		{"mulrows short y", func() { MulRows(f(5), f(6), f(3), 3, 2) }},
		{"mulrows backward short db", func() { MulRowsBackward(nil, f(2), f(6), f(6), nil, 3, 2) }},
		{"mulrows backward short da", func() { MulRowsBackward(f(5), nil, f(6), nil, f(3), 3, 2) }},
		{"mulrows backward missing a", func() { MulRowsBackward(nil, f(3), f(6), nil, nil, 3, 2) }},
		{"sigmoid length", func() { Sigmoid(f(3), f(4)) }},
		{"sigmoid backward length", func() { SigmoidBackward(f(4), f(3), f(4)) }},
	} {
		moePanics(t, c.name, c.f)
	}

	// Route checks every index before it writes.
	r, counts := slices.Repeat([]int64{-7}, 12), []int{-7, -7, -7}
	moePanics(t, "route", func() { Route(r, counts, []int64{0, 2, 2, 1, 0, 5}, 3, 2, 3) })
	if !slices.Equal(r, slices.Repeat([]int64{-7}, 12)) || !slices.Equal(counts, []int{-7, -7, -7}) {
		t.Errorf("a refused route wrote %v, counts %v", r, counts)
	}
}
