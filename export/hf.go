package export

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// HF writes the calls that make a Hugging Face model checkpoint the plan's
// layers. gradient_checkpointing_enable turns checkpointing on for every
// decoder layer; layers derived from GradientCheckpointingLayer then read
// their own gradient_checkpointing flag, which the loop sets per layer.
// Gradient checkpointing has no partial keep: a selective layer is
// checkpointed, and the output says so.
func (e *Export) HF(w io.Writer) error {
	ckpt := append(e.indexes("checkpoint"), e.indexes("selective")...)
	slices.Sort(ckpt)
	var b strings.Builder
	b.WriteString(sourceHeader)
	fmt.Fprintf(&b, "# The activation plan of %s for Hugging Face transformers, made by ckptplan.\n", comment(e.Model))
	if len(ckpt) == 0 {
		b.WriteString("# The plan stores every layer: leave gradient checkpointing off.\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	if len(ckpt) == len(e.Layers) {
		b.WriteString("# Checkpoint every layer.\n")
	} else {
		fmt.Fprintf(&b, "# Checkpoint layers %s; store the others.\n", ints(ckpt))
	}
	if sel := e.indexes("selective"); len(sel) > 0 {
		fmt.Fprintf(&b, "# Layers %s keep part of their tensors in the plan; gradient checkpointing cannot,\n# so they are checkpointed here (less memory, more compute). ckptplan export --to pytorch keeps them as planned.\n", ints(sel))
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "# Note: %s.\n", comment(n))
	}
	fmt.Fprintf(&b, "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n")
	if len(ckpt) < len(e.Layers) {
		fmt.Fprintf(&b, "CHECKPOINTED = {%s}\n", ints(ckpt))
		b.WriteString("for i, layer in enumerate(model.model.layers):  # GPT-2: model.transformer.h\n")
		b.WriteString("    layer.gradient_checkpointing = i in CHECKPOINTED\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
