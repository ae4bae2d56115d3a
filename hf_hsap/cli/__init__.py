"""Command-line entry points: ``hsap-sft`` (:mod:`.sft`); ``hsap-plan`` lives in :mod:`hf_hsap.inspect`."""
