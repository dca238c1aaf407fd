package gemm

import (
	"math"
	"math/rand"
	"testing"
)

// TestSgemmWith: the serial path with a caller's workspace gives Sgemm's
// bits for every kernel and transpose, and allocates nothing.
func TestSgemmWith(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	for _, kern := range kernels() {
		kn := kern.name
		restore, _ := useKernel(kn)
		ws := make([]float32, Workspace())
		for _, sh := range [][3]int{{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {200, 300, 290}, {128, 1100, 64}} {
			m, n, k := sh[0], sh[1], sh[2]
			for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				a := randSlice(r, m*k)
				b := randSlice(r, k*n)
				lda, ldb := k, n
				if tr[0] {
					lda = m
				}
				if tr[1] {
					ldb = k
				}
				want, got := make([]float32, m*n), make([]float32, m*n)
				Sgemm(tr[0], tr[1], m, n, k, a, lda, b, ldb, want, n, false)
				SgemmWith(ws, tr[0], tr[1], m, n, k, a, lda, b, ldb, got, n, false)
				for i := range want {
					if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
						t.Fatalf("%s %v %v: element %d = %v, Sgemm %v", kn, sh, tr, i, got[i], want[i])
					}
				}
				if allocs := testing.AllocsPerRun(3, func() {
					SgemmWith(ws, tr[0], tr[1], m, n, k, a, lda, b, ldb, got, n, true)
				}); allocs != 0 {
					t.Errorf("%s %v: SgemmWith allocates %v times", kn, sh, allocs)
				}
			}
		}
		restore()
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}
