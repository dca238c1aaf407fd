// Package minplus holds the min-plus kernels of the optimal solver's
// table (solver's fill.go): a tile of Group × Group entries and Lanes
// columns updated over a run of splits, and a row. Each has a portable Go
// version and, on amd64 where the CPU has AVX-512, an assembly one that
// gives the same bits (TestKernelsAgree); the dispatch is here, so that
// package solver imports the standard library only.
package minplus

const (
	Group = 4 // entries a (and b) in the kernel's registers
	Lanes = 8 // columns in the kernel's registers
)

// rowGo sets dst[k] = min(dst[k], x[k] + y[k]).
func rowGo(dst, x, y []float64) {
	x, y = x[:len(dst)], y[:len(dst)]
	for k, v := range x {
		dst[k] = min(dst[k], v+y[k])
	}
}

// tileGo is the kernel: for each of n splits j, acc[i][k][w] =
// min(acc[i][k][w], left[j][i][w] + right[j][k][w]).
func tileGo(n int, left, right []float64, acc *[Group * Group * Lanes]float64) {
	left, right = left[:n*Group*Lanes], right[:n*Group*Lanes]
	for j := range n {
		l := left[j*Group*Lanes:][:Group*Lanes]
		r := right[j*Group*Lanes:][:Group*Lanes]
		for i := range Group {
			for k := range Group {
				a := acc[(i*Group+k)*Lanes:][:Lanes]
				li, rk := l[i*Lanes:][:Lanes], r[k*Lanes:][:Lanes]
				for w := range Lanes {
					a[w] = min(a[w], li[w]+rk[w])
				}
			}
		}
	}
}
