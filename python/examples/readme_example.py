"""The README's Python example: plan a model's activations, apply the plan,
train a step. (A placeholder until the README shows one; CI runs this file
against the installed wheel.)"""
import torch
import transformers

import ckptplan

config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
                                  num_attention_heads=2, intermediate_size=64, vocab_size=64)
model = transformers.LlamaForCausalLM(config)

plan = ckptplan.plan(model, budget="64MiB", batch=2, seq=16)
print(ckptplan.apply(model, plan))

ids = torch.randint(0, config.vocab_size, (2, 16))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
print("loss %.3f" % loss.item())
