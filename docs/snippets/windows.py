import torch
import hf_hsap

sp = hf_hsap.init_sequence_parallel(1)
cu_seqlens = torch.tensor([0, 100, 164, 300])
plan = hf_hsap.plan_sequence(cu_seqlens, sp, windows={None: 1, 16: 5})    # 1 full layer, 5 with window 16
q, k, v = (torch.randn(300, 4, 64, requires_grad=True) for _ in range(3))
sinks = torch.zeros(4, requires_grad=True)                                # one logit per query head
out = hf_hsap.hsap_attn_func(plan.shard(q), plan.shard(k), plan.shard(v), plan, window=16, softcap=50.0,
                             sinks=sinks)
plan.gather(out).sum().backward()
print(plan.stats().kinds["window=16"].recv_kv_tokens)                     # per rank, a layer of that kind
