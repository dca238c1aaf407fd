import torch
import transformers

import ckptplan

config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=192, vocab_size=128)
model = transformers.LlamaForCausalLM(config)  # or a PEFT model; random weights here
data = [{"input_ids": list(range(1, n)), "labels": list(range(1, n))} for n in (9, 17, 33, 25) * 4]


def pad(batch):  # pads each batch to its longest sequence, as transformers' collators do
    n = max(len(e["input_ids"]) for e in batch)
    ids = torch.tensor([e["input_ids"] + [0] * (n - len(e["input_ids"])) for e in batch])
    labels = torch.tensor([e["labels"] + [-100] * (n - len(e["labels"])) for e in batch])
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


args = transformers.TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                      max_steps=4, report_to=[], use_cpu=True, save_strategy="no")
trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=pad)
plan = ckptplan.prepare_trainer(trainer, "64MiB")  # on a GPU, no budget: its memory
print(plan.summary())
trainer.train()
