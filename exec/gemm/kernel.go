package gemm

// A micro-kernel is the only part of the product that depends on the
// instruction set. The rest of the package reads its tile shape and cache
// block sizes from microKernel, so adding a kernel means adding one value to
// the list that the build's kernels function returns.
//
// The block sizes follow from the tile: an A sliver (kc·mr floats) must stay
// in L1 while every B sliver of the block streams past it, and the packed B
// block (kc·nc floats) must stay in L2 while the tasks walk over it. mc only
// bounds the packing buffer and sets how finely the rows are shared among
// goroutines.

// microKernel describes one micro-kernel and the cache blocking tuned for it.
type microKernel struct {
	name       string
	mr, nr     int // tile of C computed per call
	kc, mc, nc int // cache block sizes; mc is a multiple of mr, nc of nr

	// tile sets the mr×nr tile at c (row stride ldc) to the product of a
	// packed A sliver and B sliver of k steps, plus the old tile when acc.
	tile func(k int, a, b, c []float32, ldc int, acc bool)

	// packA and packB pack full slivers of A and B faster than pack.go's
	// loops; their zero value leaves it to the loops.
	packA, packB sliverPacker
}

// sliverPacker packs a full sliver of w = mr or nr lines for k steps. Each
// function may be nil, or report false when it cannot take the operands (a
// stride too large for its indices); the Go loop then does the work.
type sliverPacker struct {
	// interleave reads w strided rows: dst[p·w+r] = src[r·ld+p].
	interleave func(k int, src []float32, ld int, dst []float32) bool
	// copy reads k strided runs of w: dst[p·w+r] = src[p·ld+r].
	copy func(k int, src []float32, ld int, dst []float32) bool
}

// pack runs the packer's interleave or copy on a full sliver and reports
// whether it did.
func (sp sliverPacker) pack(interleave bool, k int, src []float32, ld int, dst []float32) bool {
	f := sp.copy
	if interleave {
		f = sp.interleave
	}
	return f != nil && f(k, src, ld, dst)
}

// active is the kernel Sgemm uses: the first of kernels(), which lists what
// this build and CPU can run, fastest first. Tests swap it to cover each.
var active = kernels()[0]

// Kernel reports the inner kernel in use: "avx512", "avx2", or "go".
func Kernel() string { return active.name }

// useKernel makes Sgemm use the named kernel and returns a function that
// restores the previous one; it reports false if the kernel cannot run here.
func useKernel(name string) (restore func(), ok bool) {
	for _, kn := range kernels() {
		if kn.name == name {
			prev := active
			active = kn
			return func() { active = prev }, true
		}
	}
	return func() {}, false
}

// goKernel is the portable kernel: 4×4 keeps the sixteen sums in registers on
// machines with sixteen floating-point registers, and it is the reference
// the assembly kernels are tested against besides float64.
var goKernel = &microKernel{
	name: "go",
	mr:   4, nr: 4,
	kc: 256, mc: 64, nc: 1024,
	tile: tile4x4,
}

func tile4x4(k int, a, b, c []float32, ldc int, acc bool) {
	a, b = a[:4*k], b[:4*k]
	var s00, s01, s02, s03, s10, s11, s12, s13 float32
	var s20, s21, s22, s23, s30, s31, s32, s33 float32
	for p := 0; p < 4*k; p += 4 {
		bp := b[p : p+4 : p+4]
		ap := a[p : p+4 : p+4]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		s00, s01, s02, s03 = s00+a0*b0, s01+a0*b1, s02+a0*b2, s03+a0*b3
		a1 := ap[1]
		s10, s11, s12, s13 = s10+a1*b0, s11+a1*b1, s12+a1*b2, s13+a1*b3
		a2 := ap[2]
		s20, s21, s22, s23 = s20+a2*b0, s21+a2*b1, s22+a2*b2, s23+a2*b3
		a3 := ap[3]
		s30, s31, s32, s33 = s30+a3*b0, s31+a3*b1, s32+a3*b2, s33+a3*b3
	}
	sums := [4][4]float32{
		{s00, s01, s02, s03},
		{s10, s11, s12, s13},
		{s20, s21, s22, s23},
		{s30, s31, s32, s33},
	}
	for r := range 4 {
		row := c[r*ldc : r*ldc+4 : r*ldc+4]
		for j := range row {
			if acc {
				row[j] += sums[r][j]
			} else {
				row[j] = sums[r][j]
			}
		}
	}
}
