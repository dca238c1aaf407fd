package kernel

import (
	"math"
	"math/rand"
	"testing"
)

const normEps = 1e-5

// normRefLayerNorm is LayerNorm in float64, straight from the definition.
func normRefLayerNorm(x, w, b []float64, rows, cols int) (y, mean, rstd []float64) {
	y, mean, rstd = make([]float64, rows*cols), make([]float64, rows), make([]float64, rows)
	for i := range rows {
		xr := x[i*cols : (i+1)*cols]
		var m, v float64
		for _, e := range xr {
			m += e
		}
		m /= float64(cols)
		for _, e := range xr {
			v += (e - m) * (e - m)
		}
		r := 1 / math.Sqrt(v/float64(cols)+normEps)
		mean[i], rstd[i] = m, r
		for j, e := range xr {
			y[i*cols+j] = (e-m)*r*w[j] + b[j]
		}
	}
	return y, mean, rstd
}

// normRefRMSNorm is RMSNorm in float64.
func normRefRMSNorm(x, w []float64, rows, cols int) (y, rstd []float64) {
	y, rstd = make([]float64, rows*cols), make([]float64, rows)
	for i := range rows {
		xr := x[i*cols : (i+1)*cols]
		var ss float64
		for _, e := range xr {
			ss += e * e
		}
		r := 1 / math.Sqrt(ss/float64(cols)+normEps)
		rstd[i] = r
		for j, e := range xr {
			y[i*cols+j] = w[j] * e * r
		}
	}
	return y, rstd
}

// normFilled returns n copies of v: the starting value of an accumulated
// gradient, so that a kernel that overwrites instead of adding shows.
func normFilled(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// normMinus returns a − v elementwise, undoing normFilled's start.
func normMinus(a []float32, v float32) []float32 {
	s := make([]float32, len(a))
	for i := range a {
		s[i] = a[i] - v
	}
	return s
}

func TestLayerNorm(t *testing.T) {
	fdEachShape(t, func(t *testing.T, rng *rand.Rand, rows, cols int) {
		x := fdRand(rng, rows*cols, -1, 2)
		w := fdRand(rng, cols, 0.5, 1.5)
		b := fdRand(rng, cols, -1, 1)
		g := fdRand(rng, rows*cols, -1, 1)
		x64, w64, b64 := fdWiden(x), fdWiden(w), fdWiden(b)

		y, mean, rstd := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
		LayerNorm(y, mean, rstd, x, w, b, rows, cols, normEps)
		wy, wm, wr := normRefLayerNorm(x64, w64, b64, rows, cols)
		fdCheck(t, "y", wy, y, fdTol)
		fdCheck(t, "mean", wm, mean, fdTol)
		fdCheck(t, "rstd", wr, rstd, fdTol)

		const start = 0.25
		dx, dw, db := make([]float32, rows*cols), normFilled(cols, start), normFilled(cols, start)
		LayerNormBackward(dx, dw, db, x, mean, rstd, w, g, rows, cols)
		loss := func(x, w, b []float64) float64 {
			y, _, _ := normRefLayerNorm(x, w, b, rows, cols)
			return fdDot(y, g)
		}
		fdGradCheck(t, "dx", func(v []float64) float64 { return loss(v, w64, b64) }, x, dx)
		fdGradCheck(t, "dw", func(v []float64) float64 { return loss(x64, v, b64) }, w, normMinus(dw, start))
		fdGradCheck(t, "db", func(v []float64) float64 { return loss(x64, w64, v) }, b, normMinus(db, start))

		// Recomputing the statistics must give the kept-statistics
		// result to the bit, and a second run the first run's bits.
		rdx, rdw, rdb := make([]float32, rows*cols), normFilled(cols, start), normFilled(cols, start)
		LayerNormBackwardRecompute(rdx, rdw, rdb, x, w, g, rows, cols, normEps)
		fdSameBits(t, "recomputed dx", dx, rdx)
		fdSameBits(t, "recomputed dw", dw, rdw)
		fdSameBits(t, "recomputed db", db, rdb)
		y2, m2, r2 := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
		LayerNorm(y2, m2, r2, x, w, b, rows, cols, normEps)
		fdSameBits(t, "y", y, y2)
		fdSameBits(t, "rstd", rstd, r2)

		// Frozen parameters and no bias.
		fdx := make([]float32, rows*cols)
		LayerNormBackward(fdx, nil, nil, x, mean, rstd, w, g, rows, cols)
		fdSameBits(t, "frozen dx", dx, fdx)
		LayerNorm(y2, m2, r2, x, w, nil, rows, cols, normEps)
		wy0, _, _ := normRefLayerNorm(x64, w64, make([]float64, cols), rows, cols)
		fdCheck(t, "y without bias", wy0, y2, fdTol)

		fdNoAllocs(t, "forward", func() { LayerNorm(y, mean, rstd, x, w, b, rows, cols, normEps) })
		fdNoAllocs(t, "backward", func() { LayerNormBackward(dx, dw, db, x, mean, rstd, w, g, rows, cols) })
		fdNoAllocs(t, "recompute", func() { LayerNormBackwardRecompute(dx, dw, db, x, w, g, rows, cols, normEps) })
	})
}

// TestLayerNormLargeMean checks the two-pass statistics: a one-pass
// E[x²]−E[x]² in float32 loses every digit of the variance here.
func TestLayerNormLargeMean(t *testing.T) {
	const rows, cols = 2, 64
	rng := rand.New(rand.NewSource(7))
	x := fdRand(rng, rows*cols, 1e4-1, 1e4+1)
	w, b := normFilled(cols, 1), make([]float32, cols)
	y, mean, rstd := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
	LayerNorm(y, mean, rstd, x, w, b, rows, cols, normEps)
	wy, _, wr := normRefLayerNorm(fdWiden(x), fdWiden(w), fdWiden(b), rows, cols)
	fdCheck(t, "rstd", wr, rstd, 1e-6)
	fdCheck(t, "y", wy, y, 1e-3) // x − mean keeps x's rounding, 1e-3 at 1e4
}

func TestRMSNorm(t *testing.T) {
	fdEachShape(t, func(t *testing.T, rng *rand.Rand, rows, cols int) {
		// Away from 0: a one-column row is nearly sign(x), whose
		// curvature near 0 defeats finite differences.
		x := fdRand(rng, rows*cols, 0.2, 1.2)
		for i := range x {
			if rng.Intn(2) == 0 {
				x[i] = -x[i]
			}
		}
		w := fdRand(rng, cols, 0.5, 1.5)
		g := fdRand(rng, rows*cols, -1, 1)
		x64, w64 := fdWiden(x), fdWiden(w)

		y, xsq, rstd, nrm := make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows), make([]float32, rows*cols)
		RMSNorm(y, xsq, rstd, nrm, x, w, rows, cols, normEps)
		wy, wr := normRefRMSNorm(x64, w64, rows, cols)
		fdCheck(t, "y", wy, y, fdTol)
		fdCheck(t, "rstd", wr, rstd, fdTol)
		ones := make([]float64, cols)
		for j := range ones {
			ones[j] = 1
		}
		wn, _ := normRefRMSNorm(x64, ones, rows, cols)
		fdCheck(t, "normalized", wn, nrm, fdTol)
		for i, v := range x {
			if xsq[i] != v*v {
				t.Fatalf("xsq[%d] = %v, want %v", i, xsq[i], v*v)
			}
		}

		const start = 0.25
		dx, dw := make([]float32, rows*cols), normFilled(cols, start)
		RMSNormBackward(dx, dw, x, xsq, rstd, nrm, w, g, rows, cols)
		loss := func(x, w []float64) float64 {
			y, _ := normRefRMSNorm(x, w, rows, cols)
			return fdDot(y, g)
		}
		fdGradCheck(t, "dx", func(v []float64) float64 { return loss(v, w64) }, x, dx)
		fdGradCheck(t, "dw", func(v []float64) float64 { return loss(x64, v) }, w, normMinus(dw, start))

		// A frozen weight passes neither dw nor normalized; the
		// Megatron path recomputes rstd; both give the same bits.
		fdx := make([]float32, rows*cols)
		RMSNormBackward(fdx, nil, x, nil, rstd, nil, w, g, rows, cols)
		fdSameBits(t, "frozen dx", dx, fdx)
		rdx, rdw := make([]float32, rows*cols), normFilled(cols, start)
		RMSNormBackwardRecompute(rdx, rdw, x, w, g, rows, cols, normEps)
		fdSameBits(t, "recomputed dx", dx, rdx)
		fdSameBits(t, "recomputed dw", dw, rdw)
		y2, r2 := make([]float32, rows*cols), make([]float32, rows)
		RMSNorm(y2, nil, r2, nil, x, w, rows, cols, normEps)
		fdSameBits(t, "y without intermediates", y, y2)
		fdSameBits(t, "rstd without intermediates", rstd, r2)

		fdNoAllocs(t, "forward", func() { RMSNorm(y, xsq, rstd, nrm, x, w, rows, cols, normEps) })
		fdNoAllocs(t, "backward", func() { RMSNormBackward(dx, dw, x, xsq, rstd, nrm, w, g, rows, cols) })
		fdNoAllocs(t, "recompute", func() { RMSNormBackwardRecompute(dx, dw, x, w, g, rows, cols, normEps) })
	})
}

func TestNormLengthPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("LayerNorm with a short y did not panic")
		}
	}()
	LayerNorm(make([]float32, 3), make([]float32, 1), make([]float32, 1), make([]float32, 4), make([]float32, 4), nil, 1, 4, normEps)
}
