//go:build !amd64 || purego

package solver

func minPlusTile(n int, left, right []float64, acc *[group * group * lanes]float64) {
	minPlusTileGo(n, left, right, acc)
}

func minPlusRow(dst, x, y []float64) { minPlusRowGo(dst, x, y) }
