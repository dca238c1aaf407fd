package vmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// expSweep calls f with consecutive batches of the points −87 + i·1e-5,
// i ≤ 17.5 million: every float32 below 2⁻¹⁷ apart, all binades of the
// result from 2⁻¹²⁶ to 2¹²⁷.
func expSweep(f func(x []float32)) {
	const n = 17_500_000
	var x [4096]float32
	for i := 0; i <= n; i += len(x) {
		m := min(len(x), n+1-i)
		for j := range m {
			x[j] = float32(-87 + float64(i+j)*1e-5)
		}
		f(x[:m])
	}
}

// expRandom returns 2¹⁶ float32s uniform in [lo, hi) from a PCG seeded
// with seed1 and seed2.
func expRandom(seed1, seed2 uint64, lo, hi float64) []float32 {
	rng := rand.New(rand.NewPCG(seed1, seed2))
	x := make([]float32, 1<<16)
	for i := range x {
		x[i] = float32(lo + (hi-lo)*rng.Float64())
	}
	return x
}

// TestExpAccuracy checks every path against float64 math.Exp over the
// sweep and over random float32s of [−87, 88].
func TestExpAccuracy(t *testing.T) {
	random := expRandom(1, 2, -87, 88)
	for _, p := range expPaths() {
		t.Run(p.name, func(t *testing.T) {
			worst, at := 0.0, float32(0)
			check := func(x []float32) {
				y := make([]float32, len(x))
				p.exp(y, x)
				for i, v := range x {
					want := math.Exp(float64(v))
					if e := math.Abs(float64(y[i])-want) / want; e > worst {
						worst, at = e, v
					}
				}
			}
			expSweep(check)
			check(random)
			t.Logf("max relative error %.3g at x = %v", worst, at)
			if worst >= 2e-7 {
				t.Errorf("max relative error %.3g at x = %v, want < 2e-7", worst, at)
			}
		})
	}
}

// TestExpPathsAgree checks that every path gives the Go loop's bits, over
// the sweep and random inputs that reach past both clamps.
func TestExpPathsAgree(t *testing.T) {
	random := expRandom(3, 4, -120, 100)
	for _, p := range expPaths() {
		t.Run(p.name, func(t *testing.T) {
			bad := 0
			check := func(x []float32) {
				got, want := make([]float32, len(x)), make([]float32, len(x))
				p.exp(got, x)
				expGo(want, x)
				for i, v := range x {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) && bad < 10 {
						t.Errorf("exp(%v) = %v, Go loop gives %v", v, got[i], want[i])
						bad++
					}
				}
			}
			expSweep(check)
			check(random)
		})
	}
}

// TestExpSpecial checks the clamps and special values. Subnormal results
// may differ from the correctly rounded value by one unit: the polynomial's
// error can move a value across a rounding boundary.
func TestExpSpecial(t *testing.T) {
	inf := float32(math.Inf(1))
	tests := []struct {
		x, want float32
		ulps    int32
	}{
		{0, 1, 0},
		{float32(math.Copysign(0, -1)), 1, 0},
		{1, float32(math.E), 0},
		{-inf, 0, 0},
		{inf, inf, 0},
		{89, inf, 0},
		{88.73, inf, 0},
		{1000, inf, 0},
		{88.72, float32(math.Exp(float64(float32(88.72)))), 1},
		{88.5, float32(math.Exp(88.5)), 1},
		{-87, float32(math.Exp(-87)), 1},
		{-100, float32(math.Exp(-100)), 1}, // subnormal
		{-103, float32(math.Exp(-103)), 1}, // subnormal
		{-104, 0, 0},
		{-200, 0, 0},
		{math.SmallestNonzeroFloat32, 1, 0},
	}
	for _, p := range expPaths() {
		t.Run(p.name, func(t *testing.T) {
			for _, c := range tests {
				var y [1]float32
				p.exp(y[:], []float32{c.x})
				d := int32(math.Float32bits(y[0])) - int32(math.Float32bits(c.want))
				if d < -c.ulps || d > c.ulps {
					t.Errorf("exp(%v) = %v, want %v", c.x, y[0], c.want)
				}
			}
			var y [1]float32
			p.exp(y[:], []float32{float32(math.NaN())})
			if !math.IsNaN(float64(y[0])) {
				t.Errorf("exp(NaN) = %v, want NaN", y[0])
			}
		})
	}
}

// TestExpLengths runs every length from 0 to 40, into a separate buffer
// and in place, and checks the values past len(src) stay untouched.
func TestExpLengths(t *testing.T) {
	const sentinel = -12345
	for _, p := range expPaths() {
		t.Run(p.name, func(t *testing.T) {
			for n := range 41 {
				src := make([]float32, n)
				for i := range src {
					src[i] = float32(i)*0.37 - 7
				}
				want := make([]float32, n)
				for i, v := range src {
					want[i] = exp1(v)
				}
				dst := make([]float32, n+3)
				for i := range dst {
					dst[i] = sentinel
				}
				p.exp(dst[:n], src)
				inPlace := append([]float32(nil), src...)
				p.exp(inPlace, inPlace)
				for i := range n {
					if dst[i] != want[i] || inPlace[i] != want[i] {
						t.Errorf("n = %d: exp(%v) = %v (in place %v), want %v", n, src[i], dst[i], inPlace[i], want[i])
					}
				}
				for i := n; i < len(dst); i++ {
					if dst[i] != sentinel {
						t.Errorf("n = %d: dst[%d] = %v was written", n, i, dst[i])
					}
				}
			}
		})
	}
}

func TestExpLongerDst(t *testing.T) {
	dst := []float32{-1, -1, -1}
	Exp(dst, []float32{0, 0})
	if dst[0] != 1 || dst[1] != 1 || dst[2] != -1 {
		t.Errorf("Exp into a longer dst gave %v, want [1 1 -1]", dst)
	}
}

func TestExpShortDstPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Exp with a short dst did not panic")
		}
	}()
	Exp(make([]float32, 2), make([]float32, 3))
}

func TestExpAllocs(t *testing.T) {
	x := make([]float32, 37)
	if n := testing.AllocsPerRun(100, func() { Exp(x, x) }); n != 0 {
		t.Errorf("Exp allocates %v times per run, want 0", n)
	}
}
