package gemm

// Packing copies a block of op(A) or op(B) into the sliver layout the
// micro-kernels read: an A sliver stores, for each step p, the mr values of
// column p of op(A) next to each other; a B sliver stores, for each p, the nr
// values of row p of op(B). Rows or columns past the matrix edge are zero, so
// the kernel never needs to know it is at an edge.
//
// Depending on the transposition a full sliver is either k runs of w
// contiguous floats (transposed A, untransposed B) or w contiguous rows to
// interleave (untransposed A, transposed B). Kernels may bring assembly for
// both (see sliverPacker); the loops here handle partial slivers and the
// portable build. They walk the source along its contiguous direction and
// write dst with stride w, which is fine because a sliver is at most kc·nr
// floats and stays in L1 while it is written.

// packA packs rows [i, i+rows) and steps [p0, p0+kb) of op(A) into dst, an
// mr-tall sliver of kb·mr floats.
func packA(a matrix, i, rows, p0, kb, mr int, dst []float32, sp sliverPacker) {
	if a.trans {
		// op(A)[i+r][p] = a[(p0+p)*ld + i+r]
		packSliver(false, kb, a.data[p0*a.ld+i:], a.ld, rows, mr, dst, sp)
		return
	}
	packSliver(true, kb, a.data[i*a.ld+p0:], a.ld, rows, mr, dst, sp)
}

// packB packs steps [p0, p0+kb) and columns [j, j+cols) of op(B) into dst,
// an nr-wide sliver of kb·nr floats.
func packB(b matrix, p0, kb, j, cols, nr int, dst []float32, sp sliverPacker) {
	if !b.trans {
		packSliver(false, kb, b.data[p0*b.ld+j:], b.ld, cols, nr, dst, sp)
		return
	}
	// op(B)[p][j+c] = b[(j+c)*ld + p0+p]
	packSliver(true, kb, b.data[j*b.ld+p0:], b.ld, cols, nr, dst, sp)
}

// packSliver packs n ≤ w lines of k steps from src (stride ld) into the
// first k·w floats of dst: w rows to interleave, or k runs to copy. A full
// sliver goes to the kernel's packer first, a partial one straight to the
// loops, which zero lines n..w-1.
func packSliver(interleaved bool, k int, src []float32, ld, n, w int, dst []float32, sp sliverPacker) {
	dst = dst[:k*w]
	if n == w && sp.pack(interleaved, k, src, ld, dst) {
		return
	}
	if interleaved {
		interleave(k, src, ld, n, w, dst)
	} else {
		copyRuns(k, src, ld, n, w, dst)
	}
}

// copyRuns sets dst[p·w+r] = src[p·ld+r] for r < n and zero for n ≤ r < w.
func copyRuns(k int, src []float32, ld, n, w int, dst []float32) {
	for p := range k {
		d := dst[p*w : (p+1)*w]
		copy(d, src[p*ld:p*ld+n])
		clear(d[n:])
	}
}

// interleave sets dst[p·w+r] = src[r·ld+p] for r < n and zero for n ≤ r < w.
func interleave(k int, src []float32, ld, n, w int, dst []float32) {
	for r := range n {
		row := src[r*ld : r*ld+k]
		for p, v := range row {
			dst[p*w+r] = v
		}
	}
	if n < w {
		for p := range k {
			clear(dst[p*w+n : (p+1)*w])
		}
	}
}
