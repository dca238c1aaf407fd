package export

import (
	"io"

	"github.com/ckptplan/ckptplan/ir"
)

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
	return e.underSAC().pythonModule(w, command, "FSDP2", usage, nil, pythonRuntime(layersRuntime, sacRuntime, layerRuntime, fsdp2Runtime))
}
