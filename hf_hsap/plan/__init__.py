"""The planner: pure, device-free planning of one packed batch over a group (layout, placement, transfers, rounds,
schedules, cost model). No ``torch.distributed``, process groups or device queries (``.importlinter`` checks)."""
