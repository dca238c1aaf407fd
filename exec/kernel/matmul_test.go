package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// mmRng is a seeded generator, so every test draws the same numbers.
func mmRng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }

// mmRand returns n values uniform in [-1, 1).
func mmRand(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	return x
}

// mmNaN returns n NaNs: a buffer a kernel must overwrite entirely.
func mmNaN(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.NaN())
	}
	return x
}

// mmMaxAbs is the largest magnitude in x.
func mmMaxAbs[T float32 | float64](x []T) float64 {
	var m float64
	for _, v := range x {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// mmClose reports elements of got farther than tol·(|want_i| + max|want|)
// from want: a relative error measured against the tensor's magnitude, so
// entries near zero after cancellation are not held to a tighter bound
// than float32 can meet.
func mmClose[T float32 | float64](t *testing.T, name string, got []float32, want []T, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, want %d", name, len(got), len(want))
	}
	scale := mmMaxAbs(want)
	bad := 0
	for i, w := range want {
		wf := float64(w)
		if d := math.Abs(float64(got[i]) - wf); !(d <= tol*(math.Abs(wf)+scale)) {
			if bad < 5 {
				t.Errorf("%s[%d] = %v, want %v (error %.3g)", name, i, got[i], wf, d)
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d elements differ", name, bad, len(want))
	}
}

// mmSame reports whether a and b hold the same bits.
func mmSame(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// mmGrad is one input of a gradient check: the values x the forward reads,
// and grad, the slice the backward fills with ∂L/∂x, writing it or, when acc
// is set, adding to it.
type mmGrad struct {
	name string
	x    []float32
	grad []float32
	acc  bool
}

// mmStep is the finite-difference step.
const mmStep = 1e-2

// mmMaxChecked bounds how many elements of each input are perturbed.
const mmMaxChecked = 48

// mmGradCheck compares a backward with central differences of
// L = Σ y·r (float64) for a random r. forward recomputes y from the inputs;
// backward gets ∂L/∂y = r. Written gradients start as NaN, to catch
// elements the backward skips; accumulated ones start random, to check that
// the backward adds.
func mmGradCheck(t *testing.T, rng *rand.Rand, y []float32, forward func(), backward func(dy []float32), ins ...mmGrad) {
	t.Helper()
	forward()
	r := mmRand(rng, len(y))
	loss := func() float64 {
		forward()
		var l float64
		for i, v := range y {
			l += float64(v) * float64(r[i])
		}
		return l
	}
	bases := make([][]float32, len(ins))
	for i, in := range ins {
		if in.acc {
			bases[i] = mmRand(rng, len(in.grad))
			copy(in.grad, bases[i])
		} else {
			copy(in.grad, mmNaN(len(in.grad)))
		}
	}
	backward(r)
	for i, in := range ins {
		ana := make([]float64, len(in.grad))
		for j, g := range in.grad {
			ana[j] = float64(g)
			if in.acc {
				ana[j] -= float64(bases[i][j])
			}
		}
		scale := mmMaxAbs(ana)
		idx := rng.Perm(len(in.x))
		bad := 0
		for _, j := range idx[:min(len(idx), mmMaxChecked)] {
			old := in.x[j]
			in.x[j] = old + mmStep
			up, hp := loss(), float64(in.x[j])
			in.x[j] = old - mmStep
			down, hm := loss(), float64(in.x[j])
			in.x[j] = old
			num := (up - down) / (hp - hm)
			if d := math.Abs(num - ana[j]); !(d <= 1e-2*max(math.Abs(num), math.Abs(ana[j]), 0.1*scale)) {
				if bad < 5 {
					t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", in.name, j, ana[j], num)
				}
				bad++
			}
		}
		if bad > 5 {
			t.Errorf("%s: %d elements differ", in.name, bad)
		}
	}
	forward()
}

// mmAllocs fails when f allocates.
func mmAllocs(t *testing.T, name string, f func()) {
	t.Helper()
	if n := testing.AllocsPerRun(5, f); n != 0 {
		t.Errorf("%s allocates %v times per run", name, n)
	}
}

// mmRefProduct is op(A)·op(B) in float64 for the test of mmSgemm.
func mmRefProduct(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if transA {
					ai = p*lda + i
				}
				if transB {
					bi = j*ldb + p
				}
				av, bv := a[ai], b[bi]
				s += float64(av) * float64(bv)
			}
			c[i*n+j] = s
		}
	}
	return c
}

func TestMmSgemm(t *testing.T) {
	for _, tc := range []struct{ m, n, k, pad int }{
		{1, 1, 1, 0}, {3, 5, 7, 0}, {5, 3, 1, 2}, {2, 70, 9, 3}, {13, 130, 17, 1}, {4, 4, 0, 0},
	} {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			for _, acc := range []bool{false, true} {
				name := fmt.Sprintf("%dx%dx%d/pad%d/trans%v/acc%v", tc.m, tc.n, tc.k, tc.pad, tr, acc)
				t.Run(name, func(t *testing.T) {
					rng := mmRng(1)
					ar, ac := tc.m, tc.k
					if tr[0] {
						ar, ac = tc.k, tc.m
					}
					br, bc := tc.k, tc.n
					if tr[1] {
						br, bc = tc.n, tc.k
					}
					lda, ldb, ldc := ac+tc.pad, bc+tc.pad, tc.n+tc.pad
					a, b := mmRand(rng, max(ar*lda, 1)), mmRand(rng, max(br*ldb, 1))
					c := mmRand(rng, tc.m*ldc)
					c0 := append([]float32(nil), c...)
					want := mmRefProduct(tr[0], tr[1], tc.m, tc.n, tc.k, a, lda, b, ldb)
					mmSgemm(tr[0], tr[1], tc.m, tc.n, tc.k, a, lda, b, ldb, c, ldc, acc)
					got := make([]float32, tc.m*tc.n)
					for i := 0; i < tc.m; i++ {
						for j := 0; j < tc.n; j++ {
							got[i*tc.n+j] = c[i*ldc+j]
							if acc {
								want[i*tc.n+j] += float64(c0[i*ldc+j])
							}
						}
						for j := tc.n; j < ldc; j++ {
							if c[i*ldc+j] != c0[i*ldc+j] {
								t.Fatalf("padding c[%d][%d] changed", i, j)
							}
						}
					}
					mmClose(t, "c", got, want, 1e-5)
				})
			}
		}
	}
}

// mmMatMulCase is a batched product's shape.
type mmMatMulCase struct {
	batch, group, m, n, k int
	transB                bool
}

func (tc mmMatMulCase) String() string {
	return fmt.Sprintf("b%d_g%d_%dx%dx%d_t%v", tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB)
}

var mmMatMulCases = []mmMatMulCase{
	{1, 1, 1, 1, 1, false},
	{2, 1, 3, 5, 4, false},
	{2, 1, 3, 5, 4, true},
	{1, 3, 5, 2, 7, true},
	{2, 2, 4, 3, 5, false},
	{3, 0, 2, 3, 1, true},
}

// mmRefMatMul is MatMul in float64.
func mmRefMatMul(tc mmMatMulCase, a, b []float32) []float64 {
	g := max(tc.group, 1)
	ldb := tc.n
	if tc.transB {
		ldb = tc.k
	}
	var c []float64
	for i := 0; i < tc.batch*g; i++ {
		c = append(c, mmRefProduct(false, tc.transB, tc.m, tc.n, tc.k,
			a[i*tc.m*tc.k:], tc.k, b[(i/g)*tc.k*tc.n:], ldb)...)
	}
	return c
}

func TestMatMul(t *testing.T) {
	for _, tc := range mmMatMulCases {
		t.Run(tc.String(), func(t *testing.T) {
			rng := mmRng(2)
			g := max(tc.group, 1)
			a := mmRand(rng, tc.batch*g*tc.m*tc.k)
			b := mmRand(rng, tc.batch*tc.k*tc.n)
			c := mmNaN(tc.batch * g * tc.m * tc.n)
			MatMul(c, a, b, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB)
			mmClose(t, "c", c, mmRefMatMul(tc, a, b), 1e-5)

			da, db := make([]float32, len(a)), make([]float32, len(b))
			mmGradCheck(t, rng, c,
				func() { MatMul(c, a, b, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB) },
				func(dc []float32) { MatMulBackward(da, db, dc, a, b, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB) },
				mmGrad{name: "a", x: a, grad: da}, mmGrad{name: "b", x: b, grad: db})
		})
	}
}

func TestMatMulOptionalGrads(t *testing.T) {
	tc := mmMatMulCase{2, 2, 3, 4, 5, true}
	rng := mmRng(3)
	a, b, dc := mmRand(rng, 2*2*3*5), mmRand(rng, 2*5*4), mmRand(rng, 2*2*3*4)
	da, db := make([]float32, len(a)), make([]float32, len(b))
	MatMulBackward(da, db, dc, a, b, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB)
	da2, db2 := make([]float32, len(a)), make([]float32, len(b))
	// Each gradient alone needs only its partner operand.
	MatMulBackward(da2, nil, dc, nil, b, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB)
	MatMulBackward(nil, db2, dc, a, nil, tc.batch, tc.group, tc.m, tc.n, tc.k, tc.transB)
	if !mmSame(da, da2) || !mmSame(db, db2) {
		t.Error("gradients computed alone differ from gradients computed together")
	}
}

func TestMatMulAllocs(t *testing.T) {
	rng := mmRng(4)
	a, b, c := mmRand(rng, 2*2*3*5), mmRand(rng, 2*5*4), make([]float32, 2*2*3*4)
	da, db := make([]float32, len(a)), make([]float32, len(b))
	mmAllocs(t, "MatMul", func() { MatMul(c, a, b, 2, 2, 3, 4, 5, false) })
	mmAllocs(t, "MatMulBackward", func() { MatMulBackward(da, db, c, a, b, 2, 2, 3, 4, 5, false) })
}

func TestMatMulDeterministic(t *testing.T) {
	rng := mmRng(5)
	a, b := mmRand(rng, 3*2*9*70), mmRand(rng, 3*70*11)
	c1, c2 := make([]float32, 3*2*9*11), make([]float32, 3*2*9*11)
	MatMul(c1, a, b, 3, 2, 9, 11, 70, false)
	MatMul(c2, a, b, 3, 2, 9, 11, 70, false)
	da1, db1 := make([]float32, len(a)), make([]float32, len(b))
	da2, db2 := make([]float32, len(a)), make([]float32, len(b))
	MatMulBackward(da1, db1, c1, a, b, 3, 2, 9, 11, 70, false)
	MatMulBackward(da2, db2, c2, a, b, 3, 2, 9, 11, 70, false)
	if !mmSame(c1, c2) || !mmSame(da1, da2) || !mmSame(db1, db2) {
		t.Error("two runs differ")
	}
}

// TestMatMulStrided checks the strided product and its gradients against
// MatMul's on the same matrices gathered densely: B as heads transposed
// out of [s, heads, d] and as one matrix repeated (a batch stride of 0).
func TestMatMulStrided(t *testing.T) {
	const batch, m, n, k = 3, 4, 5, 6
	for _, transB := range []bool{false, true} {
		rows, cols := k, n
		if transB {
			rows, cols = n, k
		}
		a := make([]float32, batch*m*k)
		for i := range a {
			a[i] = float32(i%7) - 3
		}
		// B[i] is rows×cols, interleaved: element (r, c) of matrix i at
		// r·batch·cols + i·cols + c.
		inter := make([]float32, batch*rows*cols)
		for i := range inter {
			inter[i] = float32(i%5) - 2
		}
		for _, tc := range []struct {
			name string
			bs   Strided
			at   func(i, r, c int) float32
		}{
			{"transposed heads", Strided{Batch: cols, Row: batch * cols}, func(i, r, c int) float32 { return inter[r*batch*cols+i*cols+c] }},
			{"repeated", Strided{Off: 2, Batch: 0, Row: cols}, func(i, r, c int) float32 { return inter[2+r*cols+c] }},
		} {
			dense := make([]float32, batch*rows*cols)
			for i := 0; i < batch; i++ {
				for r := 0; r < rows; r++ {
					for c := 0; c < cols; c++ {
						dense[(i*rows+r)*cols+c] = tc.at(i, r, c)
					}
				}
			}
			want, got := make([]float32, batch*m*n), make([]float32, batch*m*n)
			MatMul(want, a, dense, batch, 1, m, n, k, transB)
			MatMulStrided(got, a, Strided{Row: k, Batch: m * k}, inter, tc.bs, batch, m, n, k, transB)
			dc := make([]float32, batch*m*n)
			for i := range dc {
				dc[i] = float32(i%3) - 1
			}
			wda, wdb := make([]float32, len(a)), make([]float32, len(dense))
			gda, gdb := make([]float32, len(a)), make([]float32, len(dense))
			MatMulBackward(wda, wdb, dc, a, dense, batch, 1, m, n, k, transB)
			MatMulStridedBackward(gda, gdb, dc, a, Strided{Row: k, Batch: m * k}, inter, tc.bs, batch, m, n, k, transB)
			for _, p := range []struct {
				what      string
				got, want []float32
			}{{"c", got, want}, {"da", gda, wda}, {"db", gdb, wdb}} {
				for i := range p.want {
					if p.got[i] != p.want[i] {
						t.Fatalf("%s, transB %v: %s[%d] = %v, want %v", tc.name, transB, p.what, i, p.got[i], p.want[i])
					}
				}
			}
		}
	}
}
