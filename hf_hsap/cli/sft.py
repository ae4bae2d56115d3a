"""``hsap-sft``: TRL's ``trl sft`` with HSAP sequence parallelism; every ``trl sft`` flag plus the ``hsap_*`` ones.

    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml -m hf_hsap.cli.sft \\
        --model_name_or_path path/to/model --dataset_name path/to/data --packing --use_cpu \\
        --hsap_sp_size 4 --hsap_ulysses_size 2 --output_dir out
    hsap-sft --config sft.yaml                       # TRL's YAML form (any SFTConfig / hsap_* field)

It parses exactly what ``trl sft`` parses (``ScriptArguments``, ``SFTConfig``, ``ModelConfig``,
``DatasetMixtureConfig``, with ``SFTConfig`` replaced by :class:`~hf_hsap.integrations.arguments.HSAPSFTConfig`)
and runs TRL's own script (``trl.scripts.sft.main``: dataset mixtures, PEFT, quantization, saving) with
``HSAPSFTTrainer`` in place of ``SFTTrainer``. That substitution is scoped to the call and checked: re-writing
TRL's script here would be a twin that drifts from it. Before anything is built, an ALST / context-parallel
``parallelism_config`` (in the YAML, the arguments or the Accelerate config) is refused with the fix.

Checkpoints are atomic and ``--resume_from_checkpoint latest`` takes the newest complete one; SIGTERM / SIGUSR1
on any rank saves a checkpoint after the current step and exits with status 75 (:mod:`hf_hsap.checkpoint`).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..checkpoint import PREEMPTED_EXIT_CODE

__all__ = ["main", "make_parser", "run"]


def make_parser(prog: str = "hsap-sft") -> Any:
    """TRL's ``sft`` parser with :class:`HSAPSFTConfig` (``TrlParser``: flags, ``--config file.yaml``)."""
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

    from ..integrations.arguments import HSAPSFTConfig

    return TrlParser((ScriptArguments, HSAPSFTConfig, ModelConfig, DatasetMixtureConfig), prog=prog)


def _check_yaml(argv: Sequence[str]) -> None:
    """Refuse a ``--config`` YAML with an ALST / context-parallel block (``parallelism_config*`` keys)."""
    argv = list(argv)
    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    path = path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return
    import yaml

    from ..topology import check_parallelism_config

    def walk(node: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield str(key), value
                yield from walk(value)

    found = {k.removeprefix("parallelism_config_"): v for k, v in walk(yaml.safe_load(Path(path).read_text()) or {})
             if k.startswith("parallelism_config_") or k in ("sp_size", "cp_size", "tp_size", "sp_backend")}
    if found:
        from types import SimpleNamespace

        check_parallelism_config(SimpleNamespace(**{k: found.get(k, 1) for k in ("cp_size", "sp_size", "tp_size")},
                                                 sp_backend=found.get("sp_backend", "deepspeed")))


def run(script_args: Any, training_args: Any, model_args: Any, dataset_args: Any,
        callbacks: Sequence[Any] = (), trainer_class: type | None = None) -> Any:
    """TRL's SFT script with the HSAP trainer.

    Args:
        script_args, training_args, model_args, dataset_args: what :func:`make_parser` parsed
            (``training_args`` an ``HSAPSFTConfig``).
        callbacks: ``TrainerCallback`` factories ``f(trainer) -> callback`` added to the trainer.
        trainer_class: a subclass of ``HSAPSFTTrainer`` to run (default ``HSAPSFTTrainer``).

    Returns:
        The trainer (after ``train``, ``save_model`` and ``end``); after a preemption
        (``trainer.hsap_preempted``) the final ``save_model`` is skipped: the checkpoint holds the state.
    """
    import trl
    from trl.scripts import sft as trl_sft

    from ..integrations.trainer import HSAPSFTTrainer
    from ..topology import check_parallelism_config

    check_parallelism_config(getattr(training_args, "parallelism_config", None))
    check_parallelism_config()  # what `accelerate launch` exported from its config file
    made: list[Any] = []
    base = trainer_class or HSAPSFTTrainer

    class _Trainer(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for make in callbacks:
                self.add_callback(make(self))
            made.append(self)

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
            if self.hsap_preempted and not _internal_call:  # TRL's final save: the run is not finished
                return
            super().save_model(output_dir, _internal_call=_internal_call)

    _Trainer.__name__ = base.__name__
    original = trl.SFTTrainer
    trl.SFTTrainer = _Trainer  # TRL's main imports `from trl import SFTTrainer` at call time
    try:
        trl_sft.main(script_args, training_args, model_args, dataset_args)
    finally:
        trl.SFTTrainer = original
    if not made:
        raise RuntimeError("trl.scripts.sft.main did not build the HSAP trainer (TRL changed how it imports "
                           "SFTTrainer); use HSAPSFTTrainer directly and report this")
    return made[0]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``) like ``trl sft`` and train (see the module docstring)."""
    import hf_hsap  # noqa: F401  (registers attn_implementation="hsap")

    argv = list(sys.argv[1:] if argv is None else argv)
    _check_yaml(argv)
    parser = make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(
        args=argv, fail_with_unknown_args=True)
    trainer = run(script_args, training_args, model_args, dataset_args)
    if trainer.hsap_preempted:
        sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
