package gemm

// Sgemm follows the layered scheme of Goto and van de Geijn ("Anatomy of
// High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008) as refined in
// BLIS (Van Zee and van de Geijn, ACM TOMS 41(3), 2015):
//
//	for jc over n in steps of nc          (B block: kc×nc, kept in L2)
//	  for pc over k in steps of kc
//	    pack op(B)[pc:pc+kc, jc:jc+nc] into nr-wide slivers
//	    for each task (a range of mr-row slivers of C × a range of B slivers)
//	      pack op(A)[rows, pc:pc+kc] into mr-tall slivers
//	      for each A sliver                (kc×mr, stays in L1)
//	        for each B sliver              (kc×nr, streams from L2)
//	          micro-kernel: C tile (+)= A sliver · B sliver
//
// Packing is where transposition is absorbed: whatever transA and transB
// say, the micro-kernel sees the same layout, so one kernel per instruction
// set serves the forward product and both gradient products. Packing also
// zero-pads the last sliver of each dimension, so edge tiles run the same
// kernel into a scratch tile that is then merged into C.
//
// Work is split over blocks of C only, never over k: every element of C is
// the sum over pc blocks in ascending order of the kernel's ascending-p sum,
// added to C at the end of each block. That order does not depend on how many
// goroutines run or which one computes a tile, so the result bits do not
// depend on GOMAXPROCS. (A full tile and an edge tile agree too: the kernel
// and the merge both compute C + S with S finished first.)
//
// Cost: 2·m·n·k flops; packing reads op(A) n/nc times and op(B) once.

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// Sgemm computes C = op(A)·op(B) (+ C when accumulate), row-major, where op(X) is X or Xᵀ.
// A is m×k (k×m when transA), B is k×n (n×k when transB), C is m×n; lda/ldb/ldc are row strides.
//
// With k == 0 the product is zero: C is cleared, or left alone when
// accumulate. C must not overlap A or B. The result is bitwise reproducible
// for a given kernel (see Kernel) whatever GOMAXPROCS is. Sgemm panics if a
// dimension is negative, a stride is shorter than its row, or a slice is too
// short for its shape. It costs 2·m·n·k flops plus O(mk·⌈n/1024⌉ + kn)
// packing; products of about a million multiply-adds or more run on up to
// GOMAXPROCS goroutines.
func Sgemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	if g, ok := newGemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate); ok {
		g.run(workersFor(m, n, k), accumulate)
	}
}

// newGemm checks the operands and returns the product to run, or false
// when there is nothing to multiply (C has then been cleared if it had to
// be).
func newGemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) (gemm, bool) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("gemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	A := matrix{data: a, ld: lda, trans: transA}
	B := matrix{data: b, ld: ldb, trans: transB}
	A.check("A", m, k)
	B.check("B", k, n)
	matrix{data: c, ld: ldc}.check("C", m, n)
	if m == 0 || n == 0 {
		return gemm{}, false
	}
	if k == 0 {
		if !accumulate {
			for i := range m {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return gemm{}, false
	}
	return gemm{kern: active, m: m, n: n, k: k, a: A, b: B, c: c, ldc: ldc}, true
}

// matrix is a row-major operand seen through op: element (i, j) of op(X).
type matrix struct {
	data  []float32
	ld    int
	trans bool
}

// check panics unless op(x) can be a rows×cols matrix.
func (x matrix) check(name string, rows, cols int) {
	r, c := rows, cols
	if x.trans {
		r, c = cols, rows
	}
	if x.ld < max(1, c) {
		panic(fmt.Sprintf("gemm: %s has %d columns but row stride %d", name, c, x.ld))
	}
	if r > 0 && c > 0 && len(x.data) < (r-1)*x.ld+c {
		panic(fmt.Sprintf("gemm: %s is %d×%d with stride %d but has %d elements", name, r, c, x.ld, len(x.data)))
	}
}

// serialWork is the multiply-add count below which a product stays on the
// calling goroutine: starting goroutines and splitting caches costs more than
// the second core returns.
const serialWork = 1 << 20

// workersFor decides how many goroutines share an m×n×k product.
func workersFor(m, n, k int) int {
	if m*n*k < serialWork {
		return 1
	}
	return max(1, min(runtime.GOMAXPROCS(0), m*n*k/(serialWork/2)))
}

// gemm holds one call's operands while the blocked loops run.
type gemm struct {
	kern    *microKernel
	m, n, k int
	a, b    matrix
	c       []float32
	ldc     int
}

// run executes the blocked loops on the given number of goroutines.
func (g *gemm) run(workers int, accumulate bool) {
	kn := g.kern
	mr, nr := kn.mr, kn.nr
	nc := min(kn.nc, roundUp(g.n, nr))
	bp := getBuf(kn.kc * nc)
	defer putBuf(bp)
	ws := make([]worker, workers)
	for w := range ws {
		ws[w].ap = getBuf(kn.kc * roundUp(min(g.m, kn.mc), mr))
		defer putBuf(ws[w].ap)
	}
	for jc := 0; jc < g.n; jc += nc {
		nb := min(nc, g.n-jc)
		bSlivers := ceilDiv(nb, nr)
		for pc := 0; pc < g.k; pc += kn.kc {
			kb := min(kn.kc, g.k-pc)
			blk := block{pc: pc, kb: kb, jc: jc, nb: nb, bp: *bp, acc: accumulate || pc > 0}
			parallel(workers, bSlivers, func(_, s int) {
				packB(g.b, pc, kb, jc+s*nr, min(nr, nb-s*nr), nr, blk.bp[s*nr*kb:(s+1)*nr*kb], kn.packB)
			})
			tasks := g.split(workers, bSlivers)
			parallel(workers, len(tasks), func(w, t int) {
				g.macro(&ws[w], &blk, tasks[t])
			})
		}
	}
}

// block is one (jc, pc) step: the packed B block and whether its products
// add to C or replace it.
type block struct {
	pc, kb, jc, nb int
	bp             []float32
	acc            bool
}

// task is a rectangle of C in units of slivers: A slivers [i0, i1) of the
// whole matrix and B slivers [j0, j1) of the current block.
type task struct{ i0, i1, j0, j1 int }

// worker holds one goroutine's packing buffer and scratch tile.
type worker struct {
	ap   *[]float32
	tile [maxTile]float32
}

// maxTile bounds mr·nr of every kernel, so the scratch tile needs no
// allocation.
const maxTile = 14 * 32

// split cuts C into tasks: row ranges of at most mc rows, and enough of them
// to keep every worker busy; when m is too short for that, column ranges too.
// Any split gives the same bits, so this is free to chase balance.
func (g *gemm) split(workers, bSlivers int) []task {
	mr := g.kern.mr
	aSlivers := ceilDiv(g.m, mr)
	tm := ceilDiv(aSlivers, g.kern.mc/mr)
	if workers > 1 {
		tm = roundUp(tm, workers)
	}
	tm = min(tm, aSlivers)
	tn := 1
	if tm < workers {
		tn = min(bSlivers, ceilDiv(workers, tm))
	}
	tasks := make([]task, 0, tm*tn)
	for i := range tm {
		for j := range tn {
			tasks = append(tasks, task{
				i0: i * aSlivers / tm, i1: (i + 1) * aSlivers / tm,
				j0: j * bSlivers / tn, j1: (j + 1) * bSlivers / tn,
			})
		}
	}
	return tasks
}

// macro packs the task's rows of op(A) and runs the micro-kernel over every
// tile of the task, in the worker's packing buffer and scratch tile.
func (g *gemm) macro(w *worker, blk *block, t task) {
	g.macroIn(*w.ap, w.tile[:], blk, t)
}

// mergeTile copies the valid rows×cols corner of a scratch tile into C, or
// adds it when acc is set, exactly as the kernels do for full tiles.
func mergeTile(c []float32, ldc int, t []float32, ldt, rows, cols int, acc bool) {
	for r := range rows {
		dst := c[r*ldc : r*ldc+cols]
		src := t[r*ldt : r*ldt+cols]
		if !acc {
			copy(dst, src)
			continue
		}
		for j := range dst {
			dst[j] += src[j]
		}
	}
}

// parallel calls fn(worker, task) for every task in [0, n), spreading the
// tasks over the given number of goroutines (the caller's included).
func parallel(workers, n int, fn func(w, t int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for t := range n {
			fn(0, t)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	loop := func(w int) {
		for t := int(next.Add(1) - 1); t < n; t = int(next.Add(1) - 1) {
			fn(w, t)
		}
	}
	for w := 1; w < workers; w++ {
		wg.Go(func() { loop(w) })
	}
	loop(0)
	wg.Wait()
}

// bufs recycles packing buffers between calls; a training step calls Sgemm
// with the same shapes over and over.
var bufs sync.Pool

func getBuf(n int) *[]float32 {
	if p, ok := bufs.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

func putBuf(p *[]float32) { bufs.Put(p) }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func roundUp(a, b int) int { return ceilDiv(a, b) * b }
