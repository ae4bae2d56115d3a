import hf_hsap
from hf_hsap.memory.advice import MEMORY_MODELS
from hf_hsap.memory.fit import longest_row

levers = hf_hsap.MemoryLevers(gradient_checkpointing=True, activation_offloading=True, tiled_mlp=True,
                              recompute_norms=True)
fit = longest_row(MEMORY_MODELS["llama-3-8b"], gpus=8, memory_per_gpu_gib=80, levers=levers, sharding="zero3",
                  ulysses_size=8, offload="optimizer", host_memory_gib=2048, gpus_per_node=8)
print(f"{fit.tokens:,} tokens per row: the device allows {fit.device_tokens:,}, the host {fit.host_tokens:,} "
      f"({fit.binds} binds); what stops a longer one: {fit.limiting_term}")
print(fit.memory.table())                       # GiB per GPU by term, and the host memory of the step's tensors
print(fit.host.table())                         # GiB of host memory per process by term, and per node
