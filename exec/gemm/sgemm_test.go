package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// forEachKernel runs f once per kernel this machine can execute, with that
// kernel forced.
func forEachKernel(t *testing.T, f func(t *testing.T)) {
	for _, kn := range kernels() {
		t.Run(kn.name, func(t *testing.T) {
			restore, ok := useKernel(kn.name)
			if !ok {
				t.Fatalf("useKernel(%q) = false for a listed kernel", kn.name)
			}
			defer restore()
			if got := Kernel(); got != kn.name {
				t.Fatalf("Kernel() = %q after forcing %q", got, kn.name)
			}
			f(t)
		})
	}
}

// problem is one Sgemm call with strides padded by pad beyond the minimum.
type problem struct {
	m, n, k        int
	transA, transB bool
	accumulate     bool
	pad            int
}

func (p problem) String() string {
	return fmt.Sprintf("%dx%dx%d/tA=%t/tB=%t/acc=%t/pad=%d", p.m, p.n, p.k, p.transA, p.transB, p.accumulate, p.pad)
}

// operands builds random inputs for p; the padding holds NaN so that a read
// past a row is caught by the comparison.
func (p problem) operands(rng *rand.Rand) (a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	ar, acols := p.m, p.k
	if p.transA {
		ar, acols = p.k, p.m
	}
	br, bcols := p.k, p.n
	if p.transB {
		br, bcols = p.n, p.k
	}
	a, lda = randMatrix(rng, ar, acols, p.pad)
	b, ldb = randMatrix(rng, br, bcols, p.pad)
	c, ldc = randMatrix(rng, p.m, p.n, p.pad)
	return
}

func randMatrix(rng *rand.Rand, rows, cols, pad int) ([]float32, int) {
	ld := max(1, cols+pad)
	x := make([]float32, rows*ld)
	for i := range x {
		if i%ld < cols {
			x[i] = float32(rng.NormFloat64())
		} else {
			x[i] = float32(math.NaN())
		}
	}
	return x, ld
}

// reference computes op(A)·op(B) (+C) in float64 and, per element, the scale
// sum|a||b| (+|c|) against which rounding error is measured.
func reference(p problem, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) (want, scale []float64) {
	at := func(i, q int) float64 {
		if p.transA {
			return float64(a[q*lda+i])
		}
		return float64(a[i*lda+q])
	}
	bt := func(q, j int) float64 {
		if p.transB {
			return float64(b[j*ldb+q])
		}
		return float64(b[q*ldb+j])
	}
	want = make([]float64, p.m*p.n)
	scale = make([]float64, p.m*p.n)
	for i := range p.m {
		for j := range p.n {
			var s, abs float64
			for q := range p.k {
				s += at(i, q) * bt(q, j)
				abs += math.Abs(at(i, q) * bt(q, j))
			}
			if p.accumulate {
				s += float64(c[i*ldc+j])
				abs += math.Abs(float64(c[i*ldc+j]))
			}
			want[i*p.n+j], scale[i*p.n+j] = s, abs
		}
	}
	return want, scale
}

func problems() []problem {
	shapes := [][3]int{
		{1, 1, 1}, {1, 1, 0}, {0, 3, 2}, {7, 13, 5}, {14, 32, 1}, {15, 33, 3},
		{6, 16, 9}, {13, 31, 257}, {33, 65, 17}, {29, 70, 300}, {3, 200, 40},
		{200, 3, 40}, {128, 256, 64}, {100, 1100, 20},
	}
	var ps []problem
	for _, s := range shapes {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				for _, acc := range []bool{false, true} {
					for _, pad := range []int{0, 3} {
						ps = append(ps, problem{s[0], s[1], s[2], tA, tB, acc, pad})
					}
				}
			}
		}
	}
	// Large enough to be split over goroutines and over several k blocks.
	ps = append(ps,
		problem{m: 300, n: 301, k: 600, accumulate: true, pad: 1},
		problem{m: 257, n: 130, k: 520, transA: true, transB: true},
	)
	return ps
}

func TestSgemm(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		for _, p := range problems() {
			t.Run(p.String(), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(p.m*1000+p.n), uint64(p.k)))
				a, lda, b, ldb, c, ldc := p.operands(rng)
				want, scale := reference(p, a, lda, b, ldb, c, ldc)
				Sgemm(p.transA, p.transB, p.m, p.n, p.k, a, lda, b, ldb, c, ldc, p.accumulate)
				checkResult(t, p, c, ldc, want, scale)
			})
		}
	})
}

// checkResult compares C with the reference, and checks that the padding
// after each row of C is untouched (still NaN).
func checkResult(t *testing.T, p problem, c []float32, ldc int, want, scale []float64) {
	t.Helper()
	const tol = 1e-5
	bad := 0
	for i := range p.m {
		for j := range ldc {
			if i*ldc+j >= len(c) {
				break
			}
			got := c[i*ldc+j]
			if j >= p.n {
				if !math.IsNaN(float64(got)) {
					t.Fatalf("C[%d][%d] in the row padding was written: %v", i, j, got)
				}
				continue
			}
			w := want[i*p.n+j]
			if err := math.Abs(float64(got) - w); !(err <= tol*scale[i*p.n+j]) {
				if bad++; bad <= 5 {
					t.Errorf("C[%d][%d] = %v, want %v (scale %v)", i, j, got, w, scale[i*p.n+j])
				}
			}
		}
	}
}

func TestDeterministicAcrossGOMAXPROCS(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}} {
			p := problem{m: 333, n: 517, k: 700, transA: tr[0], transB: tr[1], accumulate: true}
			t.Run(p.String(), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				a, lda, b, ldb, c, ldc := p.operands(rng)
				run := func(procs int) []float32 {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					out := slices.Clone(c)
					Sgemm(p.transA, p.transB, p.m, p.n, p.k, a, lda, b, ldb, out, ldc, p.accumulate)
					return out
				}
				one, two := run(1), run(2)
				for i := range one {
					if math.Float32bits(one[i]) != math.Float32bits(two[i]) {
						t.Fatalf("C[%d] = %v with GOMAXPROCS=1, %v with 2", i, one[i], two[i])
					}
				}
			})
		}
	})
}

func TestKernelNamesDefault(t *testing.T) {
	want := kernels()[0].name
	if got := Kernel(); got != want {
		t.Errorf("Kernel() = %q, want the fastest available %q", got, want)
	}
	switch Kernel() {
	case "avx512", "avx2", "go":
	default:
		t.Errorf("Kernel() = %q, not one of avx512, avx2, go", Kernel())
	}
	if _, ok := useKernel("sse9"); ok {
		t.Error("useKernel accepted an unknown kernel")
	}
}

func TestSgemmPanicsOnShortSlice(t *testing.T) {
	tests := []struct {
		name string
		call func()
	}{
		{"short A", func() {
			Sgemm(false, false, 2, 2, 2, make([]float32, 3), 2, make([]float32, 4), 2, make([]float32, 4), 2, false)
		}},
		{"short stride", func() {
			Sgemm(false, false, 2, 2, 2, make([]float32, 4), 1, make([]float32, 4), 2, make([]float32, 4), 2, false)
		}},
		{"negative", func() { Sgemm(false, false, -1, 2, 2, nil, 2, nil, 2, nil, 2, false) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("Sgemm did not panic")
				}
			}()
			tt.call()
		})
	}
}
