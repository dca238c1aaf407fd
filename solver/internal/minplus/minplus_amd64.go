//go:build amd64 && !purego

package minplus

import "golang.org/x/sys/cpu"

//go:noescape
func minPlusTileAVX512(n int, left, right, acc *float64)

//go:noescape
func minPlusRowAVX512(n int, dst, x, y *float64)

// The AVX-512 kernels, where the CPU has them; the portable ones give the
// same bits (TestKernelsAgree).
var haveAVX512 = cpu.X86.HasAVX512F

// Tile sets acc[i][k][w] = min(acc[i][k][w], left[j][i][w] + right[j][k][w])
// for each of n splits j.
func Tile(n int, left, right []float64, acc *[Group * Group * Lanes]float64) {
	if !haveAVX512 || n == 0 {
		tileGo(n, left, right, acc)
		return
	}
	_, _ = left[n*Group*Lanes-1], right[n*Group*Lanes-1]
	minPlusTileAVX512(n, &left[0], &right[0], &acc[0])
}

// Row sets dst[k] = min(dst[k], x[k] + y[k]).
func Row(dst, x, y []float64) {
	n := len(dst)
	if !haveAVX512 || n == 0 {
		rowGo(dst, x, y)
		return
	}
	_, _ = x[n-1], y[n-1]
	minPlusRowAVX512(n, &dst[0], &x[0], &y[0])
}
