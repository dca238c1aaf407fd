package main

import (
	"errors"
	"strings"
	"testing"
)

// TestSetupFlagErrors: a training flag's value outside its vocabulary or
// range is a usage error that names the flag and, for a vocabulary, its
// values; with several, the first in setupFlags.check's order.
func TestSetupFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--batch", "-1"}, "--batch and --seq must be positive"},
		{[]string{"--profile", "pytorch"}, `--profile: unknown value "pytorch" (valid: transformers, torch-eager, megatron)`},
		{[]string{"--attention", "sdpa2"}, `--attention: unknown value "sdpa2" (valid: eager, sdpa, sdpa-math, flash)`},
		{[]string{"--rope-tables", "x"}, `--rope-tables: unknown value "x" (valid: model, layer, cached)`},
		{[]string{"--sdpa-layout", "packed"}, `--sdpa-layout: unknown value "packed" (valid: views, contiguous, legacy)`},
		{[]string{"--kernels", "tpu"}, `--kernels: unknown value "tpu" (valid: cuda, cpu)`},
		{[]string{"--gqa-kernel", "x"}, `--gqa-kernel: unknown value "x" (valid: fused, math)`},
		{[]string{"--autocast", "fp8"}, `--autocast: unknown value "fp8" (valid: bf16, fp16, none)`},
		{[]string{"--grad-accum", "-1"}, "--grad-accum: must not be negative, got -1"},
		{[]string{"--master-weights", "fp16"}, `--master-weights: unknown value "fp16" (valid: fp32, none)`},
		{[]string{"--buffers-bytes", "-5"}, "--buffers-bytes: must not be negative, got -5"},
		{[]string{"--optimizer", "adam"}, `--optimizer: unknown value "adam" (valid: adamw, adamw-foreach, adamw-fused, adamw-forloop, adamw8bit, paged-adamw8bit, paged-adamw, sgd, none)`},
		{[]string{"--quant", "nf8"}, `--quant: unknown value "nf8" (valid: nf4, fp4, int8, none)`},
		{[]string{"--quant", "none", "--double-quant"}, "--double-quant quantizes 4-bit weights' constants: it needs --quant nf4 or fp4, not none"},
		{[]string{"--lora-dtype", "bf16"}, `--lora-dtype: unknown value "bf16" (valid: fp32, model)`},
		{[]string{"--dropout-mask", "bit"}, `--dropout-mask: unknown value "bit" (valid: byte, dtype)`},
		{[]string{"--logits-dtype", "fp16"}, `--logits-dtype: unknown value "fp16" (valid: fp32, model)`},
		{[]string{"--dtype", "fp8"}, `--dtype: unknown value "fp8" (valid: fp32, bf16, fp16)`},
		{[]string{"--logits-dtype", "fp16", "--profile", "pytorch"}, `--profile: unknown value "pytorch"`},
		{[]string{"--optimizer", "adam", "--grad-accum", "-1"}, "--grad-accum: must not be negative, got -1"},
	} {
		args := append([]string{"cost", "tiny-llama"}, tt.flags...)
		_, _, err := runCmd(args...)
		var u *usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: %v, want a usage error", tt.flags, err)
			continue
		}
		if got := err.Error(); !strings.HasPrefix(got, tt.want) {
			t.Errorf("%v: %q, want %q", tt.flags, got, tt.want)
		}
	}
}
