//go:build !amd64 || purego

package minplus

// Tile sets acc[i][k][w] = min(acc[i][k][w], left[j][i][w] + right[j][k][w])
// for each of n splits j.
func Tile(n int, left, right []float64, acc *[Group * Group * Lanes]float64) {
	tileGo(n, left, right, acc)
}

// Row sets dst[k] = min(dst[k], x[k] + y[k]).
func Row(dst, x, y []float64) { rowGo(dst, x, y) }
