package gemm_test

import (
	"fmt"

	"github.com/ckptplan/ckptplan/exec/gemm"
)

// The weight gradient dW = Xᵀ·dY of a linear layer, read straight from the
// row-major activations without transposing them first.
func ExampleSgemm() {
	x := []float32{ // batch of 3 inputs with 2 features
		1, 2,
		3, 4,
		5, 6,
	}
	dy := []float32{ // 3 output gradients with 2 features
		1, 0,
		0, 1,
		1, 1,
	}
	dw := make([]float32, 2*2)
	gemm.Sgemm(true, false, 2, 2, 3, x, 2, dy, 2, dw, 2, false)
	fmt.Println(dw)
	// Output: [6 8 8 10]
}
