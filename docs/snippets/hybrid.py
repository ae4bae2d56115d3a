import torch
from transformers import AutoModelForCausalLM
import hf_hsap
from hf_hsap.examples import builtin_config

config = builtin_config("tiny-qwen3.5", vocab_size=256)   # 3 gated delta rule layers, 1 attention layer
model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap")
sp = hf_hsap.init_sequence_parallel(1)    # under a launcher: P ranks
print(hf_hsap.prepare_model(model, sp_size=sp.size).check)  # prepares the recurrent layers: mixer_layers=3
docs = [{"input_ids": torch.randint(3, 256, (n,))} for n in (40, 9, 23)]
batch = hf_hsap.PackingCollator(max_length=72, pad_to_multiple_of=sp.size)(docs)   # one row, 3 documents
local = hf_hsap.shard_batch(batch, sp)    # this rank's tokens; a split document runs on all its ranks at once
out = model(**local)
out.loss.backward()
print(f"loss {out.loss.item():.4f}")
