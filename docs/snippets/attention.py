import torch
import hf_hsap

sp = hf_hsap.init_sequence_parallel(1)                   # one process here; under a launcher: P ranks
cu_seqlens = torch.tensor([0, 100, 164, 300])            # 3 documents over the flattened batch
plan = hf_hsap.plan_sequence(cu_seqlens, sp, placement="auto")
q, k, v = (torch.randn(300, 4, 64, requires_grad=True) for _ in range(3))       # [T, H, D] global
q_local, k_local, v_local = plan.shard(q), plan.shard(k), plan.shard(v)        # [T_local, H, D]
out = hf_hsap.hsap_attn_func(q_local, k_local, v_local, plan)                  # differentiable
plan.gather(out).sum().backward()                                              # back in global order
