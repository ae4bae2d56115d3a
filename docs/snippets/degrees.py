import hf_hsap

# Offline: a packed row of 65,536 tokens over SP 16 on 8-GPU nodes, for a model with 32 query heads
cu_seqlens = [0, 40_000, 52_000, 60_000, 64_000, 65_536]
U, estimates = hf_hsap.choose_ulysses_size(cu_seqlens, 16, num_heads=32, num_kv_heads=8, gpus_per_node=8)
print(f"fastest U = {U}; each degree's estimated step time: {estimates}")

config = hf_hsap.HSAPConfig(sp_size=16, ulysses_size=8, gpus_per_node=8)   # every option, validated here
print(config.replace(ulysses_size="auto").ulysses_size)                     # a validated copy
