package costmodel

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ckptplan/ckptplan/mem"
)

// Device is an accelerator a plan may target.
type Device struct {
	Name        string
	MemoryBytes mem.Bytes // memory the driver reports as total
	BF16FLOPS   float64   // dense bf16 tensor-core peak, FLOP/s
	Source      string
}

// Devices lists the known accelerators. Memory is what nvidia-smi reports
// as total (MiB), peak FLOP/s the vendor's dense (no sparsity) bf16 figure.
var Devices = []Device{
	{"a100-40gb", 40960 << 20, 312e12, "NVIDIA A100 datasheet (SXM, 40 GB)"},
	{"a100-80gb", 81920 << 20, 312e12, "NVIDIA A100 datasheet (SXM, 80 GB)"},
	{"h100-80gb", 81559 << 20, 989e12, "NVIDIA H100 datasheet (SXM5)"},
	{"h200", 143771 << 20, 989e12, "NVIDIA H200 datasheet (SXM, 141 GB)"},
	{"l4", 23034 << 20, 121e12, "NVIDIA L4 datasheet"},
	{"rtx-4090", 24564 << 20, 165e12, "NVIDIA Ada whitepaper (fp32 accumulate)"},
	{"rtx-3090", 24576 << 20, 71e12, "NVIDIA Ampere GA102 whitepaper (fp32 accumulate)"},
}

// Reserve is the part of the device's memory a plan leaves for what is
// not a tensor the step allocates, by default: the CUDA context with
// PyTorch's kernels loaded (about 0.5 GiB), cuBLAS and cuBLASLt
// workspaces, and the caching allocator's slack — its requests round up
// to 512 bytes and are carved from 2 MiB and 20 MiB segments, so that
// what it has reserved exceeds what tensors hold by a few percent. The
// default is 1 GiB plus 5% of the memory; it is an estimate, not a
// measurement of one setup, and a plan's --reserve replaces it.
func (d Device) Reserve() mem.Bytes {
	const mib = 1 << 20
	return (1<<30 + d.MemoryBytes/20) / mib * mib
}

// LookupDevice returns the named device, or an error listing the known ones.
func LookupDevice(name string) (Device, error) {
	for _, d := range Devices {
		if strings.EqualFold(d.Name, name) {
			return d, nil
		}
	}
	var names []string
	for _, d := range Devices {
		names = append(names, d.Name)
	}
	sort.Strings(names)
	return Device{}, fmt.Errorf("unknown device %q (valid: %s)", name, strings.Join(names, ", "))
}
