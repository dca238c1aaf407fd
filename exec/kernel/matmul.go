// Batched matrix products. For i < batch·group,
//
//	C[i] = A[i] · op(B[i/group]),  op(B) = B (k×n) or Bᵀ (B stored n×k),
//
// with A[i] m×k and C[i] m×n. The gradients of a loss L with G[i] = ∂L/∂C[i]:
//
//	∂L/∂A[i] = G[i] · op(B[i/group])ᵀ
//	∂L/∂B[j] = Σ_{i/group = j} A[i]ᵀ · G[i]      (B not transposed)
//	∂L/∂B[j] = Σ_{i/group = j} G[i]ᵀ · A[i]      (B transposed)
//
// The group lets one B serve several A matrices: grouped-query attention
// multiplies every query head of a group by the same key or value head.
//
// Every product in this package goes through the variable sgemm, so a faster
// implementation can replace the reference one below in one place.

package kernel

import (
	"fmt"

	"github.com/ckptplan/ckptplan/exec/gemm"
)

// sgemm computes C = op(A)·op(B), or C += op(A)·op(B) when accumulate is set,
// for row-major matrices: op(A) is m×k, op(B) is k×n, C is m×n, and lda, ldb,
// ldc are the row strides of A, B and C as stored.
var sgemm = countedRef

// gemmWorkspace is the packing workspace of package gemm's kernels, owned
// by the caller of UseGemm.
var gemmWorkspace []float32

// flops counts the multiply-adds of every product the kernels ran, ×2.
var flops int64

// FLOPs returns the floating-point operations of the products run since
// the last ResetFLOPs: 2·m·n·k each. Not safe while kernels run.
func FLOPs() int64 { return flops }

// ResetFLOPs sets the count to zero.
func ResetFLOPs() { flops = 0 }

// UseGemm makes every product of this package run on package gemm's SIMD
// kernels, on the calling goroutine, packing into ws (at least
// gemm.Workspace() elements), which the caller allocates and counts; nil
// goes back to the reference product. Not safe while kernels run.
func UseGemm(ws []float32) {
	gemmWorkspace = ws
	sgemm = countedRef
	if ws != nil {
		sgemm = gemmWith
	}
}

func countedRef(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	flops += 2 * int64(m) * int64(n) * int64(k)
	mmSgemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

func gemmWith(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	flops += 2 * int64(m) * int64(n) * int64(k)
	gemm.SgemmWith(gemmWorkspace, transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

// mmBlock is how many columns of C mmSgemm sums at once in a stack buffer.
const mmBlock = 64

// mmSgemm is the reference single-precision product with sgemm's signature.
// Each element of C is the sum over p of op(A)[i,p]·op(B)[p,j] in ascending p,
// starting from zero, and only then stored into or added to C: the same order
// the optimized kernels use, so the two agree up to fused multiply-add.
// It takes O(m·n·k) time and allocates nothing.
func mmSgemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	for i := 0; i < m; i++ {
		ci := c[i*ldc : i*ldc+n]
		for j0 := 0; j0 < n; j0 += mmBlock {
			var acc [mmBlock]float32
			nb := min(mmBlock, n-j0)
			if transB {
				mmDots(acc[:nb], transA, i, k, a, lda, b[j0*ldb:], ldb)
			} else {
				mmAxpys(acc[:nb], transA, i, k, a, lda, b[j0:], ldb)
			}
			cb := ci[j0 : j0+nb]
			if accumulate {
				for j, s := range acc[:nb] {
					cb[j] += s
				}
			} else {
				copy(cb, acc[:nb])
			}
		}
	}
}

// mmA is op(A)[i,p].
func mmA(transA bool, a []float32, lda, i, p int) float32 {
	if transA {
		return a[p*lda+i]
	}
	return a[i*lda+p]
}

// mmAxpys adds op(A)[i,p]·B[p, 0:len(acc)] to acc for p = 0..k-1 in order.
func mmAxpys(acc []float32, transA bool, i, k int, a []float32, lda int, b []float32, ldb int) {
	for p := 0; p < k; p++ {
		aip := mmA(transA, a, lda, i, p)
		bp := b[p*ldb : p*ldb+len(acc)]
		for j, bv := range bp {
			acc[j] += aip * bv
		}
	}
}

// mmDots sets acc[j] to the dot product of row i of op(A) and row j of B
// (B stored n×k, so op(B) = Bᵀ), summing in ascending p.
func mmDots(acc []float32, transA bool, i, k int, a []float32, lda int, b []float32, ldb int) {
	for j := range acc {
		bj := b[j*ldb : j*ldb+k]
		var s float32
		for p, bv := range bj {
			s += mmA(transA, a, lda, i, p) * bv
		}
		acc[j] = s
	}
}

// mmCheck panics when a slice holds fewer than want elements: a caller sized
// a buffer wrongly, which is a bug in the caller.
func mmCheck(what string, got, want int) {
	if got < want {
		panic(fmt.Sprintf("kernel: %s has %d elements, want at least %d", what, got, want))
	}
}

// MatMul computes C[i] = A[i]·op(B[i/group]) for i < batch·group, where A
// holds batch·group contiguous m×k matrices, B holds batch contiguous k×n
// matrices (n×k when transB: op(B) = Bᵀ), and C receives batch·group m×n
// matrices. A group of 0 means 1. With batch 1 and group N, one B is shared
// by all N products. It takes O(batch·group·m·n·k) time.
func MatMul(c, a, b []float32, batch, group, m, n, k int, transB bool) {
	group = max(group, 1)
	mmCheck("matmul a", len(a), batch*group*m*k)
	mmCheck("matmul b", len(b), batch*k*n)
	mmCheck("matmul c", len(c), batch*group*m*n)
	ldb := n
	if transB {
		ldb = k
	}
	for i := 0; i < batch*group; i++ {
		j := i / group
		sgemm(false, transB, m, n, k, a[i*m*k:], k, b[j*k*n:], ldb, c[i*m*n:], n, false)
	}
}

// MatMulBackward writes the gradients of MatMul's operands from dc, the
// gradient of C. Under torch-eager, matmul keeps each operand whose partner
// needs a gradient: da (∂L/∂A) needs b, db (∂L/∂B) needs a. A nil da or db
// is not computed, and its partner operand may then be nil too. db sums the
// group's products in ascending i. Both are written, not accumulated.
// It takes O(batch·group·m·n·k) time per gradient.
func MatMulBackward(da, db, dc, a, b []float32, batch, group, m, n, k int, transB bool) {
	group = max(group, 1)
	mmCheck("matmul dc", len(dc), batch*group*m*n)
	if da != nil {
		mmCheck("matmul da", len(da), batch*group*m*k)
		mmCheck("matmul b", len(b), batch*k*n)
		for i := 0; i < batch*group; i++ {
			bj := b[(i/group)*k*n:]
			if transB {
				// op(B) = Bᵀ, so dA = dC·B with B n×k.
				sgemm(false, false, m, k, n, dc[i*m*n:], n, bj, k, da[i*m*k:], k, false)
			} else {
				sgemm(false, true, m, k, n, dc[i*m*n:], n, bj, n, da[i*m*k:], k, false)
			}
		}
	}
	if db != nil {
		mmCheck("matmul db", len(db), batch*k*n)
		mmCheck("matmul a", len(a), batch*group*m*k)
		for i := 0; i < batch*group; i++ {
			dbj := db[(i/group)*k*n:]
			acc := i%group != 0
			if transB {
				sgemm(true, false, n, k, m, dc[i*m*n:], n, a[i*m*k:], k, dbj, k, acc)
			} else {
				sgemm(true, false, k, n, m, a[i*m*k:], k, dc[i*m*n:], n, dbj, n, acc)
			}
		}
	}
}

// Strided says where a batch of row-major matrices lies in a buffer:
// matrix i starts at Off + i·Batch, its rows Row elements apart, each row
// dense. A Batch of 0 repeats one matrix.
type Strided struct{ Off, Batch, Row int }

// MatMulStrided computes C[i] = A[i]·op(B[i]) for i < batch, as MatMul
// with a group of 1, over operands laid out as as and bs say; C is dense.
// It takes O(batch·m·n·k) time.
func MatMulStrided(c, a []float32, as Strided, b []float32, bs Strided, batch, m, n, k int, transB bool) {
	mmCheck("matmul c", len(c), batch*m*n)
	for i := 0; i < batch; i++ {
		sgemm(false, transB, m, n, k, a[as.Off+i*as.Batch:], as.Row, b[bs.Off+i*bs.Batch:], bs.Row, c[i*m*n:], n, false)
	}
}

// MatMulStridedBackward writes the gradients of MatMulStrided's operands
// from dc: da and db dense, one matrix per product (a repeated B gets one
// gradient per product, as the repeat's output does). A nil da or db is
// not computed. It takes O(batch·m·n·k) time per gradient.
func MatMulStridedBackward(da, db, dc, a []float32, as Strided, b []float32, bs Strided, batch, m, n, k int, transB bool) {
	mmCheck("matmul dc", len(dc), batch*m*n)
	for i := 0; i < batch; i++ {
		g := dc[i*m*n:]
		if da != nil {
			bi := b[bs.Off+i*bs.Batch:]
			if transB {
				sgemm(false, false, m, k, n, g, n, bi, bs.Row, da[i*m*k:], k, false)
			} else {
				sgemm(false, true, m, k, n, g, n, bi, bs.Row, da[i*m*k:], k, false)
			}
		}
		if db != nil {
			ai := a[as.Off+i*as.Batch:]
			if transB {
				sgemm(true, false, n, k, m, g, n, ai, as.Row, db[i*k*n:], k, false)
			} else {
				sgemm(true, false, k, n, m, ai, as.Row, g, n, db[i*k*n:], n, false)
			}
		}
	}
}
