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
	dst = dst[:kb*mr]
	if a.trans {
		// op(A)[i+r][p] = a[(p0+p)*ld + i+r]
		src := a.data[p0*a.ld+i:]
		if rows < mr || !sp.pack(false, kb, src, a.ld, dst) {
			copyRuns(kb, src, a.ld, rows, mr, dst)
		}
		return
	}
	src := a.data[i*a.ld+p0:]
	if rows < mr || !sp.pack(true, kb, src, a.ld, dst) {
		interleave(kb, src, a.ld, rows, mr, dst)
	}
}

// packB packs steps [p0, p0+kb) and columns [j, j+cols) of op(B) into dst,
// an nr-wide sliver of kb·nr floats.
func packB(b matrix, p0, kb, j, cols, nr int, dst []float32, sp sliverPacker) {
	dst = dst[:kb*nr]
	if !b.trans {
		src := b.data[p0*b.ld+j:]
		if cols < nr || !sp.pack(false, kb, src, b.ld, dst) {
			copyRuns(kb, src, b.ld, cols, nr, dst)
		}
		return
	}
	// op(B)[p][j+c] = b[(j+c)*ld + p0+p]
	src := b.data[j*b.ld+p0:]
	if cols < nr || !sp.pack(true, kb, src, b.ld, dst) {
		interleave(kb, src, b.ld, cols, nr, dst)
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
