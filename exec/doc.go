// Package exec runs training steps on the CPU with float32 tensors so that
// a plan's predictions can be checked by execution: every buffer is
// allocated through a Tracker that knows the live bytes at each moment, the
// stage programs of package planner say what to allocate, run and free,
// and the kernels of package kernel do the arithmetic.
package exec
