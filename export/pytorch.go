package export

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/ckptplan/ckptplan/mem"
)

// runtime is the Python that applies PLAN: per-layer checkpointing, and
// selective layers through saved-tensor hooks (PyTorch 1.13 and later).
//
//go:embed runtime.py
var runtime string

// PyTorch writes a Python module that applies the plan: apply_plan(layers)
// wraps each checkpointed layer in torch.utils.checkpoint (non-reentrant),
// runs each selective layer keeping only its plan's tensors, and leaves
// stored layers alone. command is the command line that made the plan,
// for the module's header.
func (e *Export) PyTorch(w io.Writer, command string) error {
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	if strings.Contains(string(data), "'''") {
		return fmt.Errorf("the plan's names contain ''' and cannot be quoted in Python")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The activation plan of %s for PyTorch, made by ckptplan", e.Model)
	if command != "" {
		fmt.Fprintf(&b, ":\n#   %s", command)
	}
	fmt.Fprintf(&b, "\n# Solver %s, budget %v, predicted peak %v, %+.1f%% compute.\n#\n", e.Solver, mem.Bytes(e.BudgetBytes), mem.Bytes(e.PeakBytes), 100*e.Overhead)
	b.WriteString("# Apply it once, before training, to the model's transformer layers in order:\n#\n")
	b.WriteString("#     apply_plan(model.model.layers)    # Llama, Mistral, Qwen2; GPT-2: model.transformer.h\n#\n")
	for _, l := range e.Layers {
		switch l.Mode {
		case "selective":
			fmt.Fprintf(&b, "#   %-10s selective (%s): keeps %v\n", l.Name, l.Policy, mem.Bytes(l.KeptBytes))
		default:
			fmt.Fprintf(&b, "#   %-10s %s: keeps %v\n", l.Name, l.Mode, mem.Bytes(l.KeptBytes))
		}
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "# Note: %s.\n", n)
	}
	if len(e.indexes("selective")) > 0 {
		b.WriteString("# Note: a selective layer keeps exactly its plan's tensors; to get the others back it\n" +
			"# reruns its whole forward once in backward, where the plan reruns only the ops that make them.\n")
	}
	fmt.Fprintf(&b, "import json\n\nPLAN = json.loads(r'''%s''')\n\n", data)
	b.WriteString(runtime)
	_, err = io.WriteString(w, b.String())
	return err
}
