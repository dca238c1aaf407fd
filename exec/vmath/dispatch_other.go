//go:build !amd64 || purego

package vmath

// expPaths lists the implementations of Exp this build can run: only the
// portable one.
func expPaths() []expPath { return []expPath{{"go", expGo}} }

// expBest runs the Go loop.
func expBest(dst, src []float32) { expGo(dst, src) }
