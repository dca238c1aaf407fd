// Package vmath evaluates elementary functions over float32 slices, with
// AVX-512 and AVX2 kernels on amd64 and a pure-Go loop everywhere else that
// gives the same bits.
package vmath

//go:generate go run -C ../internal/gemmgen . -exp -out ../../vmath/exp_amd64.s -stubs ../../vmath/exp_amd64.go -pkg vmath
