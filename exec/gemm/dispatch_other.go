//go:build !amd64 || purego

package gemm

// kernels lists the kernels this build can run: only the portable one.
func kernels() []*microKernel { return []*microKernel{goKernel} }
