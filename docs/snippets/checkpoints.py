from pathlib import Path

import torch
from hf_hsap.checkpoint import PREEMPTED_EXIT_CODE, PreemptionHandler, atomic_save, resolve_checkpoint, rotate

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
out, start = Path("runs/loop"), 0
ckpt = resolve_checkpoint(out, "latest")            # the newest complete checkpoint, None on a first run
if ckpt is not None:
    state = torch.load(ckpt / "state.pt")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
with PreemptionHandler() as preemption:             # SIGTERM / SIGUSR1 set a flag; handlers restored on exit
    for step in range(start, 20):
        loss = model(torch.ones(4, 8)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        stop = preemption.should_stop()             # collective: every rank, every step (all-reduce MAX)
        if stop or (step + 1) % 5 == 0:
            with atomic_save(out / f"checkpoint-{step + 1}", step + 1, is_main=True) as path:  # is_main: rank 0
                path.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                           path / "state.pt")
            rotate(out, limit=2)                    # on the main process only
        if stop:
            raise SystemExit(PREEMPTED_EXIT_CODE)
print(f"done; the newest complete checkpoint: {resolve_checkpoint(out, 'latest')}")
