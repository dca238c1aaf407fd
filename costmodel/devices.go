package costmodel

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ckptplan/ckptplan/mem"
)

// Device is an accelerator a plan may target.
type Device struct {
	Name           string
	MemoryBytes    mem.Bytes // memory the driver reports as total
	BF16FLOPS      float64   // dense bf16 tensor-core peak, FLOP/s
	FP32FLOPS      float64   // fp32 peak without tensor cores (PyTorch's default: no tf32 products), FLOP/s
	BandwidthBytes float64   // memory bandwidth, bytes/s
	// LinkBytes is what one GPU sends to its peers, bytes/s one way: its
	// NVLink (or Infinity Fabric) bandwidth, half the bidirectional
	// figure of the sheet, or for a card without it its PCIe slot's.
	LinkBytes float64
	// HostBytes is the GPU's link to the host's memory, bytes/s one way:
	// half its PCIe slot's bidirectional figure.
	HostBytes float64
	Source    string
}

// Devices lists the known accelerators: data center, workstation and
// consumer GPUs people train and fine-tune on. Memory is what the driver
// reports as total (nvidia-smi's MiB; rocm-smi's bytes for AMD's), peak
// FLOP/s the vendor's dense (no sparsity) bf16 figure — fp16 for the T4,
// which has no bf16 — and its fp32 figure without tensor cores, bandwidth
// the vendor's memory bandwidth in decimal GB/s, from the same sheets
// (the B200's fp32 is the HGX B200 board's 600 TFLOPS over its 8 GPUs).
// The link is half the sheet's bidirectional NVLink figure (NVLink 3:
// 600 GB/s, NVLink 4: 900, NVLink 5: 1.8 TB/s; the H100 NVL's bridge 600;
// the MI300X's Infinity Fabric 896), and for a PCIe card half its slot's
// (PCIe 3 x16: 32 GB/s, 4: 64, 5: 128). The host link is half the
// bidirectional figure of the PCIe slot the GPU's sheet gives (the A100's
// and the consumer and workstation Ampere and Ada cards': 4; Hopper's,
// Blackwell's and the MI300X's: 5; the T4's: 3).
var Devices = []Device{
	{"a100-40gb", 40960 << 20, 312e12, 19.5e12, 1555e9, 300e9, 32e9, "NVIDIA A100 datasheet (SXM, 40 GB)"},
	{"a100-80gb", 81920 << 20, 312e12, 19.5e12, 2039e9, 300e9, 32e9, "NVIDIA A100 datasheet (SXM, 80 GB)"},
	{"h100-80gb", 81559 << 20, 989e12, 67e12, 3350e9, 450e9, 64e9, "NVIDIA H100 datasheet (SXM5)"},
	{"h100-pcie", 81559 << 20, 756e12, 51e12, 2000e9, 64e9, 64e9, "NVIDIA H100 datasheet (PCIe, 80 GB)"},
	{"h100-nvl", 95830 << 20, 835e12, 60e12, 3900e9, 300e9, 64e9, "NVIDIA H100 datasheet (NVL, 94 GB)"},
	{"h200", 143771 << 20, 989e12, 67e12, 4800e9, 450e9, 64e9, "NVIDIA H200 datasheet (SXM, 141 GB)"},
	{"b200", 183359 << 20, 2250e12, 75e12, 8000e9, 900e9, 64e9, "NVIDIA B200 datasheet (HGX, 180 GB)"},
	{"l4", 23034 << 20, 121e12, 30.3e12, 300e9, 32e9, 32e9, "NVIDIA L4 datasheet"},
	{"l40s", 46068 << 20, 362e12, 91.6e12, 864e9, 32e9, 32e9, "NVIDIA L40S datasheet"},
	{"a40", 46068 << 20, 150e12, 37.4e12, 696e9, 32e9, 32e9, "NVIDIA A40 datasheet"},
	{"a10", 23028 << 20, 125e12, 31.2e12, 600e9, 32e9, 32e9, "NVIDIA A10 datasheet"},
	{"t4", 15360 << 20, 65e12, 8.1e12, 320e9, 16e9, 16e9, "NVIDIA T4 datasheet (fp16: no bf16)"},
	{"rtx-a6000", 49140 << 20, 155e12, 38.7e12, 768e9, 32e9, 32e9, "NVIDIA RTX A6000 datasheet"},
	{"rtx-6000-ada", 49140 << 20, 364e12, 91.1e12, 960e9, 32e9, 32e9, "NVIDIA RTX 6000 Ada datasheet"},
	{"rtx-5090", 32607 << 20, 209e12, 104.8e12, 1792e9, 64e9, 64e9, "NVIDIA RTX Blackwell whitepaper (fp32 accumulate)"},
	{"rtx-4090", 24564 << 20, 165e12, 82.6e12, 1008e9, 32e9, 32e9, "NVIDIA Ada whitepaper (fp32 accumulate)"},
	{"rtx-4080", 16376 << 20, 97e12, 48.7e12, 716.8e9, 32e9, 32e9, "NVIDIA Ada whitepaper (fp32 accumulate)"},
	{"rtx-3090", 24576 << 20, 71e12, 35.6e12, 936e9, 32e9, 32e9, "NVIDIA Ampere GA102 whitepaper (fp32 accumulate)"},
	{"mi300x", 205822885888, 1307e12, 163.4e12, 5300e9, 448e9, 64e9, "AMD Instinct MI300X datasheet (192 GB)"},
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

// LookupDevice returns the named device, or for a size ("24GiB",
// "25769803776B") a GPU with that much memory; otherwise an error listing
// the known ones.
func LookupDevice(name string) (Device, error) {
	for _, d := range Devices {
		if strings.EqualFold(d.Name, name) {
			return d, nil
		}
	}
	if n, err := mem.ParseBytes(name); err == nil && n > 0 && strings.ContainsAny(name, "BbKkMmGgTt") {
		return Device{Name: name, MemoryBytes: n, Source: "its memory, as given"}, nil
	}
	return Device{}, fmt.Errorf("unknown device %q (valid: %s, or a GPU's memory such as 24GiB)", name, strings.Join(DeviceNames(), ", "))
}

// DeviceNames returns the known devices' names, sorted.
func DeviceNames() []string {
	var names []string
	for _, d := range Devices {
		names = append(names, d.Name)
	}
	sort.Strings(names)
	return names
}
