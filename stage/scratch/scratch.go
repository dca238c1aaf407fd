// Package scratch sizes the working memory the executor's kernels
// (exec/kernel) take beside their inputs, outputs and kept tensors, in
// float32 elements. The kernels check they are given this much and the
// stage programs count it in a plan's working memory: one formula for
// both, so that the plan the executor verifies holds what its kernels
// ask for.
//
// A LoRA adapter needs its rank-r product and a chunk of rows; eager
// attention's backward one head's s×s scores; flash attention (Dao et
// al. 2022) a tile of scores and its rows' statistics, whatever the
// sequence beyond the tile.
package scratch

const (
	// FlashTileQ and FlashTileK are the flash kernels' tiles: the
	// queries and keys one tile of scores spans.
	FlashTileQ = 64
	FlashTileK = 64
	// LoRAChunk is how many rows the LoRA backward masks at a time under
	// adapter dropout.
	LoRAChunk = 32
)

// FlashTiles returns the flash kernels' tiles over a sequence of seq
// positions: FlashTileQ and FlashTileK, or the sequence where shorter.
func FlashTiles(seq int) (bq, bk int) {
	return min(FlashTileQ, seq), min(FlashTileK, seq)
}

// Flash is flash attention's forward scratch over tiles of bq queries and
// bk keys: one tile of scores and the running maximum and sum of the
// query tile's rows.
func Flash(bq, bk int) int { return bq*bk + 2*bq }

// FlashBackward is flash attention's backward scratch over tiles of bq
// queries and bk keys of a sequence of seq positions: a tile of
// probabilities and one of their gradients, and a value a row.
func FlashBackward(bq, bk, seq int) int { return 2*bq*bk + seq }

// AttentionBackward is eager attention's backward scratch: one head's
// seq × seq scores.
func AttentionBackward(seq int) int { return seq * seq }

// LoRA is a LoRA adapter's scratch over rows rows of in features at rank
// r: the rank-r product, and LoRAChunk rows of input where dropout masks
// them.
func LoRA(rows, in, r int) int { return rows*r + min(rows, LoRAChunk)*in }
