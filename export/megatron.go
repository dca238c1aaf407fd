package export

import (
	"fmt"
	"io"
	"strings"
)

// Megatron writes the Megatron-LM flags that run the plan, when they can:
// Megatron recomputes either the attention core of every layer
// (--recompute-granularity selective) or whole layers, the first N of each
// pipeline stage (--recompute-method block) or groups of N layers from a
// checkpoint at each group's input (uniform). Otherwise it says why not
// and returns an error.
func (e *Export) Megatron(w io.Writer) error {
	n := len(e.Layers)
	modes := make([]string, n)
	for i, l := range e.Layers {
		modes[i] = l.Mode
		if l.Mode == "selective" {
			modes[i] += ":" + l.Policy
		}
	}
	var flags, why string
	uniform := false
	switch {
	case all(modes, "store"):
		flags = "(none: the plan stores every layer, Megatron's default)"
	case all(modes, "selective:megatron-selective"):
		flags = "--recompute-granularity selective"
	case e.block(modes) > 0:
		flags = fmt.Sprintf("--recompute-granularity full --recompute-method block --recompute-num-layers %d", e.block(modes))
	case e.uniform() > 0:
		flags = fmt.Sprintf("--recompute-granularity full --recompute-method uniform --recompute-num-layers %d", e.uniform())
		uniform = true
	default:
		why = e.whyNot(modes)
	}
	if why != "" {
		return fmt.Errorf("the plan for %s cannot be written as Megatron-LM flags: %s", comment(e.Model), comment(why))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The activation plan of %s for Megatron-LM, made by ckptplan (one pipeline stage).\n", comment(e.Model))
	for _, note := range e.Notes {
		if !(uniform && (note == e.nothingNote || note == e.runtimeNote)) {
			fmt.Fprintf(&b, "# Note: %s.\n", comment(note))
		}
	}
	fmt.Fprintf(&b, "%s\n", flags)
	_, err := io.WriteString(w, b.String())
	return err
}

func all(modes []string, m string) bool {
	for _, x := range modes {
		if x != m {
			return false
		}
	}
	return true
}

// block returns N when the first N layers are checkpointed (each keeping
// its own input) and the rest stored, else 0.
func (e *Export) block(modes []string) int {
	k := 0
	for k < len(modes) && modes[k] == "checkpoint" && !e.nothing[k] {
		k++
	}
	if k == 0 || !all(modes[k:], "store") {
		return 0
	}
	return k
}

// uniform returns N > 1 when the layers form groups of N (the last one
// possibly shorter), each keeping only its first layer's input, else 0.
func (e *Export) uniform() int {
	n := len(e.Layers)
	size := n // the first layer after 0 that keeps its input starts group 2
	for i := 1; i < n; i++ {
		if !e.nothing[i] {
			size = i
			break
		}
	}
	for i, l := range e.Layers {
		if l.Mode != "checkpoint" || e.nothing[i] != (i%size != 0) {
			return 0
		}
	}
	if size < 2 {
		return 0
	}
	return size
}

func (e *Export) whyNot(modes []string) string {
	counts := map[string][]int{}
	var order []string
	for i, m := range modes {
		if _, ok := counts[m]; !ok {
			order = append(order, m)
		}
		counts[m] = append(counts[m], i)
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%s %s", m, ints(counts[m])))
	}
	return fmt.Sprintf("Megatron applies one granularity to every layer (selective: the attention core of all; full: the first N layers, or groups of N), and the plan has %s; export --to pytorch runs it as planned, or plan with --solver megatron-selective or --solver every-k", strings.Join(parts, "; "))
}
