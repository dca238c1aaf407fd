// Dropout with a counter-based mask.
//
//	mask[i] = 0 with probability p, else 1/(1−p)
//	y = x·mask,  dx = dy·mask
//
// Element i draws from the i-th output of splitmix64 started at seed
// (Steele, Lea and Flood 2014, "Fast splittable pseudorandom number
// generators"): a pure function of (seed, i), so a forward recomputed under
// checkpointing rebuilds the mask bit for bit from the seed alone, and any
// slice of it can be made independently. Torch-eager keeps the scaled mask
// (in the input dtype, as PyTorch's CPU kernel does); the backward reads
// nothing else. The executor should give every dropout node and step its
// own seed, mixed rather than counted (splitmix64 streams of seeds that
// differ by a multiple of the golden gamma overlap).
package kernel

import "fmt"

const dropoutGamma = 0x9e3779b97f4a7c15 // 2^64/φ, splitmix64's increment

// dropoutHash is splitmix64's output function on state seed + (i+1)·γ.
func dropoutHash(seed, i uint64) uint64 {
	z := seed + (i+1)*dropoutGamma
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// DropoutMask fills mask with 0 or 1/(1−p): element i is dropped when the
// top 24 bits of its hash, read as a fraction in [0, 1), fall below p.
// The same seed gives the same mask. It panics unless 0 ≤ p < 1.
// O(len(mask)).
func DropoutMask(mask []float32, p float32, seed uint64) {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("kernel: dropout: probability %v is not in [0, 1)", p))
	}
	scale := 1 / (1 - p)
	for i := range mask {
		u := float32(dropoutHash(seed, uint64(i))>>40) * 0x1p-24
		if u < p {
			mask[i] = 0
		} else {
			mask[i] = scale
		}
	}
}

// Dropout writes y = x·mask. y may be x. O(len(x)).
func Dropout(y, x, mask []float32) {
	pointwiseMustLen("dropout", "y", len(y), len(x))
	pointwiseMustLen("dropout", "mask", len(mask), len(x))
	y, mask = y[:len(x)], mask[:len(x)]
	for i, v := range x {
		y[i] = v * mask[i]
	}
}

// DropoutBackward writes dx = dy·mask from the kept mask. dx may be dy.
// O(len(dy)).
func DropoutBackward(dx, dy, mask []float32) { Dropout(dx, dy, mask) }

// DropoutKeep fills keep[i] with 1 where DropoutMask would keep element i
// and 0 where it would drop it: the 1-byte mask of fused kernels
// (Megatron), drawn from the same stream, so both masks agree.
func DropoutKeep(keep []uint8, p float32, seed uint64) {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("kernel: dropout: probability %v is not in [0, 1)", p))
	}
	for i := range keep {
		u := float32(dropoutHash(seed, uint64(i))>>40) * 0x1p-24
		keep[i] = 0
		if u >= p {
			keep[i] = 1
		}
	}
}

// DropoutBytes writes y = x·keep/(1−p) with a 1-byte keep mask; its
// backward is DropoutBytes of dy. It gives DropoutMask and Dropout's bits.
func DropoutBytes(y, x []float32, keep []uint8, p float32) {
	pointwiseMustLen("dropout", "y", len(y), len(x))
	pointwiseMustLen("dropout", "keep", len(keep), len(x))
	scale := 1 / (1 - p)
	y, keep = y[:len(x)], keep[:len(x)]
	for i, v := range x {
		m := float32(0)
		if keep[i] != 0 {
			m = scale
		}
		y[i] = v * m
	}
}
