package export

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
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
	// PLAN is read from a raw triple-quoted string: with every ' written
	// as the JSON escape \u0027 (JSON has no other use for it) nothing in
	// the plan can close the string, and a raw string keeps every other
	// escape for json.loads.
	plan := strings.ReplaceAll(string(data), "'", `\u0027`)
	var b strings.Builder
	fmt.Fprintf(&b, "# The activation plan of %s for PyTorch, made by ckptplan", comment(e.Model))
	if command != "" {
		fmt.Fprintf(&b, ":\n#   %s", comment(command))
	}
	fmt.Fprintf(&b, "\n# Solver %s, budget %v, predicted peak %v, %+.1f%% compute.\n#\n", comment(e.Solver), e.BudgetBytes, e.PeakBytes, 100*e.Overhead)
	b.WriteString("# Apply it once, before training, to the model's transformer layers in order:\n#\n")
	b.WriteString("#     apply_plan(model.model.layers)    # Llama, Mistral, Qwen2; GPT-2: model.transformer.h\n#\n")
	for _, l := range e.Layers {
		switch l.Mode {
		case "selective":
			fmt.Fprintf(&b, "#   %-10s selective (%s): keeps %v\n", comment(l.Name), comment(l.Policy), l.KeptBytes)
		default:
			fmt.Fprintf(&b, "#   %-10s %s: keeps %v\n", comment(l.Name), comment(l.Mode), l.KeptBytes)
		}
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "# Note: %s.\n", comment(n))
	}
	if len(e.indexes("selective")) > 0 {
		b.WriteString("# Note: a selective layer keeps exactly its plan's tensors; to get the others back it\n" +
			"# reruns its whole forward once in backward, where the plan reruns only the ops that make them.\n")
	}
	fmt.Fprintf(&b, "import json\n\nPLAN = json.loads(r'''%s''')\n\n", plan)
	b.WriteString(runtime)
	_, err = io.WriteString(w, b.String())
	return err
}

// comment makes text safe for a one-line comment of generated code: Go
// escapes (\n, \x1b, \u2028, \") for every control, non-printing or
// quoting character, so that no name from a model or a plan can end the
// comment, start a line of code or reach a terminal raw.
func comment(text string) string {
	q := strconv.Quote(text)
	return q[1 : len(q)-1]
}
