import torch
import transformers

import ckptplan

config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=192, vocab_size=128)
model = transformers.LlamaForCausalLM(config)  # or a PEFT model; random weights here
ids = torch.randint(0, config.vocab_size, (2, 32))

optimizer = torch.optim.AdamW(model.parameters(), fused=True)  # the one the step runs
store = ckptplan.plan(model, batch=2, seq=32, budget="1GiB", solver="none", optimizer=optimizer)
plan = ckptplan.plan(model, batch=2, seq=32, budget=store.peak_bytes * 95 // 100, optimizer=optimizer)
print(plan.summary())
ckptplan.apply(model, plan)
m = ckptplan.measure(model, {"input_ids": ids})
for layer, got in zip(plan.layers, m.layers):
    print(f"{layer.name}: plan keeps {layer.kept_bytes} bytes, PyTorch kept {got.kept_bytes}")
print(f"recomputed {m.recomputed_flops} FLOPs, plan {plan.recompute_flops}")
