package gemm

import "fmt"

// Workspace returns how many float32 elements SgemmWith needs as packing
// workspace for any product with the kernel in use: one packed block of
// op(B) (kc×nc), one of op(A) (mc×kc) and one scratch tile.
func Workspace() int {
	kn := active
	return kn.kc*kn.nc + kn.kc*roundUp(kn.mc, kn.mr) + maxTile
}

// SgemmWith is Sgemm on the calling goroutine, packing into the caller's
// workspace (at least Workspace() elements) instead of its own buffers, so
// that it allocates nothing: an executor that counts every byte it holds
// gives it memory it has counted. The result bits are Sgemm's.
func SgemmWith(ws []float32, transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	if len(ws) < Workspace() {
		panic(fmt.Sprintf("gemm: workspace of %d elements, want %d", len(ws), Workspace()))
	}
	if g, ok := newGemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate); ok {
		g.serial(ws, accumulate)
	}
}

// serial runs the blocked loops of run on one goroutine with the given
// workspace: the same blocks, tasks of at most mc rows, the same sums.
func (g *gemm) serial(ws []float32, accumulate bool) {
	kn := g.kern
	mr, nr := kn.mr, kn.nr
	nc := min(kn.nc, roundUp(g.n, nr))
	bp := ws[:kn.kc*nc]
	ap := ws[kn.kc*kn.nc : kn.kc*kn.nc+kn.kc*roundUp(kn.mc, mr)]
	tile := ws[len(ws)-maxTile:]
	aSlivers := ceilDiv(g.m, mr)
	per := kn.mc / mr
	for jc := 0; jc < g.n; jc += nc {
		nb := min(nc, g.n-jc)
		bSlivers := ceilDiv(nb, nr)
		for pc := 0; pc < g.k; pc += kn.kc {
			kb := min(kn.kc, g.k-pc)
			blk := block{pc: pc, kb: kb, jc: jc, nb: nb, bp: bp, acc: accumulate || pc > 0}
			for s := range bSlivers {
				packB(g.b, pc, kb, jc+s*nr, min(nr, nb-s*nr), nr, bp[s*nr*kb:(s+1)*nr*kb], kn.packB)
			}
			for i0 := 0; i0 < aSlivers; i0 += per {
				g.macroIn(ap, tile, &blk, task{i0: i0, i1: min(i0+per, aSlivers), j0: 0, j1: bSlivers})
			}
		}
	}
}

// macroIn packs the task's rows of op(A) into ap and runs the
// micro-kernel over every tile of the task, merging partial tiles at the
// edges through tile. The serial path passes buffers of the caller's
// workspace (a tile array of its own, passed to the kernel through a
// function value, would move to the heap); macro a worker's.
func (g *gemm) macroIn(ap, tile []float32, blk *block, t task) {
	kn := g.kern
	mr, nr, kb := kn.mr, kn.nr, blk.kb
	for s := t.i0; s < t.i1; s++ {
		i := s * mr
		packA(g.a, i, min(mr, g.m-i), blk.pc, kb, mr, ap[(s-t.i0)*mr*kb:(s-t.i0+1)*mr*kb], kn.packA)
	}
	for s := t.i0; s < t.i1; s++ {
		i := s * mr
		rows := min(mr, g.m-i)
		as := ap[(s-t.i0)*mr*kb : (s-t.i0+1)*mr*kb]
		for u := t.j0; u < t.j1; u++ {
			j := blk.jc + u*nr
			cols := min(nr, blk.jc+blk.nb-j)
			bs := blk.bp[u*nr*kb : (u+1)*nr*kb]
			if rows == mr && cols == nr {
				kn.tile(kb, as, bs, g.c[i*g.ldc+j:], g.ldc, blk.acc)
				continue
			}
			kn.tile(kb, as, bs, tile, nr, false)
			mergeTile(g.c[i*g.ldc+j:], g.ldc, tile, nr, rows, cols, blk.acc)
		}
	}
}
