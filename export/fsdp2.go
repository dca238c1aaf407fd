package export

import (
	_ "embed"
	"io"

	"github.com/ckptplan/ckptplan/ir"
)

// The FSDP2 module carries three files: the Python package's own
// decoder-layer discovery (layers.py; python/ckptplan/layers.py links
// here) and selective checkpointing (sac.py; python/ckptplan/_sac.py
// links here), and the FSDP2 runtime.
//
//go:embed layers.py
var layersRuntime string

// sacRuntime finds and applies a selective layer's policy for PyTorch's
// selective activation checkpointing.
//
//go:embed sac.py
var sacRuntime string

// fsdp2Runtime applies PLAN with apply_activation_checkpointing, before
// FSDP2's fully_shard.
//
//go:embed fsdp2.py
var fsdp2Runtime string

// The FSDP2 target: the plan as a module for FSDP2 (PyTorch's
// fully_shard), which runs ZeRO stage 3, so that a plan under ZeRO is
// one for FSDP2.
var fsdp2Target = &Target{Name: "fsdp2", Help: "a Python module wrapping layers before fully_shard", Sharder: ir.ShardingFSDP2,
	Write: func(w io.Writer, e *Export, _ *Setting, command string) ([]string, error) {
		return nil, e.FSDP2(w, command)
	}}

// FSDP2 writes a Python module that applies the plan to a model before
// FSDP2's fully_shard: apply_plan(model) wraps the layers the plan does
// not store with apply_activation_checkpointing, a check_fn picking them
// and checkpoint_wrapper (non-reentrant), a selective layer's wrapper
// caching exactly its plan's tensors through selective activation
// checkpointing (PyTorch 2.4 and later), which reruns only the ops that
// make the others: the figures it prints are that runtime's.
func (e *Export) FSDP2(w io.Writer, command string) error {
	usage := "# Apply it once, before fully_shard, to the model (or its nn.ModuleList of decoder layers):\n#\n" +
		"#     apply_plan(model)\n" +
		"#     for layer in model.model.layers:    # GPT-2: model.transformer.h\n" +
		"#         fully_shard(layer)\n" +
		"#     fully_shard(model)\n#\n"
	return e.underSAC().pythonModule(w, command, "FSDP2", usage, nil, layersRuntime+"\n\n"+sacRuntime+"\n\n"+fsdp2Runtime)
}
