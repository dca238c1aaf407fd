// Command ckptplan plans activation checkpointing for training transformer
// models: which activations to keep and which to recompute so that a
// training step fits a memory budget with the least extra compute.
//
// Usage:
//
//	ckptplan models
//	ckptplan inspect MODEL [--batch N] [--seq N] [--dtype fp32|bf16|fp16] [--format text|json]
//	ckptplan cost MODEL [--batch --seq --dtype --profile --attention --lora-rank --tp --sp --dp --zero --sharding --reshard] [--format text|json]
//	ckptplan plan MODEL|CHAIN.yaml --budget 24GiB [--solver selective] [--device h100-80gb] [--runtime per-layer|nested] [--slots N] [--format text|json|yaml]
//	ckptplan compare MODEL|CHAIN.yaml --budget 40GiB [--format text|json]
//	ckptplan run MODEL --budget 5MiB [--solver selective] [--seq N] [--batch N] [--timeline FILE.svg] [--format text|json]
//	ckptplan sweep MODEL [--points N] [--svg FILE.svg] [--format text|json]
//	ckptplan export MODEL|PLAN.json --to pytorch|hf|megatron [--budget 24GiB ...] [-o FILE]
//
// MODEL is a bundled model name (see 'ckptplan models'), a model, graph or
// chain YAML file, or a Hugging Face config.json.
//
// Examples:
//
//	ckptplan models
//	ckptplan inspect llama-3-8b --seq 4096
//	ckptplan inspect ./config.json --format json
//	ckptplan cost llama-3-8b --seq 8192 --attention flash
//	ckptplan plan llama-3-8b --seq 8192 --budget 40GiB
//	ckptplan compare llama-3-8b --seq 8192 --budget 40GiB
//	ckptplan run tiny-llama --budget 5MiB
//	ckptplan sweep llama-3-8b --lora-rank 16 --svg sweep.svg
//	ckptplan export llama-3-8b --seq 8192 --budget 40GiB --to pytorch -o plan.py
//
// Results go to standard output, diagnostics to standard error. The exit
// status is 0 on success, 1 on failure and 2 for a usage error.
package main
