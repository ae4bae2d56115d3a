import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_hsap
from hf_hsap.examples import save_tiny_model
from hf_hsap.integrations import (SPDataLoader, dp_grad_scale, global_num_items, hsap_model_loss,
                                  reduce_loss_for_logging)

cuda = torch.cuda.is_available()                # on CPU, cpu=True makes Accelerate count the processes;
accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")  # CUDA kernels take bf16
with accelerator.main_process_first():
    path = save_tiny_model("runs/tiny-llama")                  # or a Hub name / local model directory
model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="hsap").train()
config = hf_hsap.HSAPConfig(sp_size=accelerator.num_processes, model_config=model.config)  # every option
sp = hf_hsap.init_sequence_parallel(config)     # groups from one DeviceMesh (dp, sp_inter, sp_intra)
levers = hf_hsap.MemoryLevers(gradient_checkpointing=True)  # the loss in tiles (the default), layers recomputed
prepared = hf_hsap.prepare_model(model, sp_size=sp.size, levers=levers)  # the one step that changes the model,
                                                # before accelerator.prepare; refuses what "hsap" cannot run exactly

tokenizer = AutoTokenizer.from_pretrained(path)
docs = [{"input_ids": tokenizer(f"document {i}: " + "word " * (3 + 7 * i))["input_ids"]} for i in range(16)]
collate = hf_hsap.PackingCollator(max_length=64, pad_to_multiple_of=sp.size)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(docs, batch_size=4, collate_fn=collate))

for local in SPDataLoader(loader, sp):          # the SP group shares each global batch, planned and sharded
    n = global_num_items(local["shift_labels"], sp)          # valid targets of the whole step (SP x DP)
    with prepared.offload():                    # activation offloading, when on (CUDA)
        loss = hsap_model_loss(model, local, n, grad_scale=dp_grad_scale(sp),  # forward (the plan rides in the
                               sp=sp)           # kwargs) + loss, never the full logits; sp=: raises if an
        accelerator.backward(loss)              # attention layer did not run the plan; after DDP/FSDP averaging:
    optimizer.step()                            # the single-device gradient
    optimizer.zero_grad()
print(f"loss {reduce_loss_for_logging(loss, sp, dp_grad_scale(sp)):.4f}")  # the same on every rank
