// Package gemm multiplies single-precision row-major matrices for the CPU
// training executor, with AVX-512 and AVX2 micro-kernels on amd64 and a
// pure-Go kernel everywhere else.
package gemm

//go:generate go run -C ../internal/gemmgen . -out ../../gemm/kernel_amd64.s -stubs ../../gemm/kernel_amd64.go -pkg gemm
