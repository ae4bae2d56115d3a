"""The planner: pure, device-free planning of one packed batch over a group (layout, placement,
transfers, rounds, schedules, the cost model). Imports nothing above it: no ``torch.distributed``, no
process groups, no device queries (checked by the import contract in ``.importlinter``)."""
