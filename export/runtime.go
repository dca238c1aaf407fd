package export

import (
	_ "embed"
	"strings"
)

// The Python the exported modules carry, the same files the ckptplan
// package runs (python/ckptplan links to each): one runtime for every way
// a plan is applied.

// layersRuntime finds a model's decoder layers (layers.py;
// python/ckptplan/layers.py links here).
//
//go:embed layers.py
var layersRuntime string

// sacRuntime finds and applies a selective layer's policy for PyTorch's
// selective activation checkpointing (sac.py; python/ckptplan/_sac.py
// links here).
//
//go:embed sac.py
var sacRuntime string

// layerRuntime runs each decoder layer as its plan entry says: stored,
// checkpointed, or selective through sacRuntime, or where PyTorch has none
// through saved-tensor hooks (runtime.py; python/ckptplan/_runtime.py
// links here).
//
//go:embed runtime.py
var layerRuntime string

// pytorchRuntime applies PLAN to the layers a user passes.
//
//go:embed pytorch.py
var pytorchRuntime string

// fsdp2Runtime applies PLAN with apply_activation_checkpointing, before
// FSDP2's fully_shard.
//
//go:embed fsdp2.py
var fsdp2Runtime string

// pythonRuntime joins runtime files into a module's code, in order: each
// uses the names of those before it.
func pythonRuntime(files ...string) string {
	return strings.Join(files, "\n\n")
}
