package kernel

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// Shared helpers for the kernel tests. Gradients are checked against
// central differences of float64 reference forwards, which leaves the
// float32 kernels' own rounding as the only error of note; forwards are
// checked against the same references.

// fdShapes are the rows×cols cases every row-wise kernel runs: single rows
// and columns, odd sizes, and one row longer than a cache line.
var fdShapes = []struct{ rows, cols int }{
	{1, 1}, {1, 7}, {3, 1}, {2, 2}, {4, 5}, {5, 13}, {3, 33},
}

// fdEachShape runs f as a subtest on each of fdShapes, named rows×cols,
// with a generator seeded by the shape's place in the list.
func fdEachShape(t *testing.T, f func(t *testing.T, rng *rand.Rand, rows, cols int)) {
	for k, sh := range fdShapes {
		t.Run(fmt.Sprintf("%dx%d", sh.rows, sh.cols), func(t *testing.T) {
			f(t, rand.New(rand.NewSource(int64(k+1))), sh.rows, sh.cols)
		})
	}
}

// fdStep is the central-difference step for float64 references: its
// truncation error (h²) and rounding error (ε/h) are both near 1e-11.
const fdStep = 1e-5

// fdTol bounds the error of float32 kernels against float64 references,
// relative to the largest magnitude of the expected tensor.
const fdTol = 1e-4

// fdRand returns n values uniform in [lo, hi) from rng.
func fdRand(rng *rand.Rand, n int, lo, hi float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = lo + (hi-lo)*rng.Float32()
	}
	return x
}

// fdWiden copies x to float64.
func fdWiden(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// fdMap returns the elementwise function that applies f to every value.
func fdMap(f func(float64) float64) func(x []float64) []float64 {
	return func(x []float64) []float64 {
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = f(v)
		}
		return y
	}
}

// fdDot is Σ y·g, the scalar whose gradient with respect to y is g.
func fdDot(y []float64, g []float32) float64 {
	var s float64
	for i, v := range y {
		s += v * float64(g[i])
	}
	return s
}

// fdGrad returns the central-difference gradient of f at x; f may read x
// but must not keep it.
func fdGrad(f func(x []float64) float64, x []float64) []float64 {
	g := make([]float64, len(x))
	for i, v := range x {
		x[i] = v + fdStep
		p := f(x)
		x[i] = v - fdStep
		m := f(x)
		x[i] = v
		g[i] = (p - m) / (2 * fdStep)
	}
	return g
}

// fdCheck reports the elements of got farther than tol·max(1, max|want|)
// from want.
func fdCheck(t *testing.T, what string, want []float64, got []float32, tol float64) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	scale := 1.0
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	bad := 0
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - w); !(d <= tol*scale) {
			if bad < 5 {
				t.Errorf("%s[%d] = %v, want %v (scale %v)", what, i, got[i], w, scale)
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d more differences", what, bad-5)
	}
}

// fdGradCheck compares a kernel's gradient with the central differences
// of the float64 loss f at x.
func fdGradCheck(t *testing.T, what string, f func(x []float64) float64, x []float32, got []float32) {
	t.Helper()
	fdCheck(t, what, fdGrad(f, fdWiden(x)), got, fdTol)
}

// fdNoAllocs fails when f allocates.
func fdNoAllocs(t *testing.T, what string, f func()) {
	t.Helper()
	if n := testing.AllocsPerRun(5, f); n != 0 {
		t.Errorf("%s: %v allocations a run, want 0", what, n)
	}
}

// fdSameBits fails unless a and b hold the same bits.
func fdSameBits(t *testing.T, what string, a, b []float32) {
	t.Helper()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Errorf("%s: run 2 gives %v at %d, run 1 %v", what, b[i], i, a[i])
			return
		}
	}
}
