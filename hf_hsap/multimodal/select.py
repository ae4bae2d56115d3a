"""Make a vision-language model keep only this rank's feature rows (what :mod:`.shard` chose).

The model encodes the local items whole (``get_image_features`` / ``get_video_features``) and then checks that its
placeholders match the features before it merges them. Under SP a rank holds only some placeholders of a split
item, so the encoders' outputs are cut to the rows of ``hsap_vision_rows``, in local token order, before the merge.
This wraps the two methods of the model instance (Transformers' public feature hooks; the model code is untouched)
and takes ``hsap_vision_rows`` out of the forward's keyword arguments with a pre-hook. The keyword arguments the
encoders receive lose hf_hsap's own keys, so a vision tower never sees the decoder's SP plan.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..log import get_logger
from ..model_state import PROBE_KEY, VISION_ROWS, ModelChanges, state_of
from .audio import AUDIO_TOKENS, encode_per_clip, output_mask_key
from .audio_inline import has_inline_audio, inline_audio_encoder, inline_audio_pre
from .exchange import exchange_rows
from .indicators import prepare_indicators
from .shard import ROWS_KEY, exchange_key, items_key, window_key
from .spec import inner_vlm, vision_spec
from .structure import fix, token

__all__ = ["keep_rows", "prepare_vision", "select_rows"]

logger = get_logger(__name__)
_FEATURE_METHODS = {"image": "get_image_features", "video": "get_video_features", "audio": "get_audio_features"}
_SELECTED_FIELDS = ("pooler_output", "deepstack_features")  # Qwen3-VL's deepstack rows follow the placeholders
_DECODER_KEYS = ("position_ids", "shift_labels", "num_items_in_batch", "cu_seq_lens_q", "cu_seq_lens_k",
                 "max_length_q", "max_length_k")  # a packed row's keys for the decoder, never an encoder's


def _audio_fields(output: Any) -> tuple[str, ...]:
    """The fields of an audio encoder's output that hold its rows: ``pooler_output`` (the projected rows
    AudioFlamingo 3, Voxtral, ... merge), with ``last_hidden_state`` where that holds the same rows (the omni
    thinkers merge it), else ``last_hidden_state``."""
    pooled, last = getattr(output, "pooler_output", None), getattr(output, "last_hidden_state", None)
    if pooled is None:
        return ("last_hidden_state",)
    same = torch.is_tensor(pooled) and torch.is_tensor(last) and last.shape == pooled.shape
    return ("pooler_output", "last_hidden_state") if same else ("pooler_output",)


def _select(value: Any, rows: torch.Tensor) -> Any:
    """``value``'s feature rows ``rows``, in the container the model's merge expects."""
    if torch.is_tensor(value):
        flat = value.reshape(-1, value.shape[-1])[rows.to(value.device)]  # [items, n, D] or [N, D] -> [n_local, D]
        return flat.unsqueeze(0) if value.dim() == 3 else flat  # per item: one item of the local rows [1, n_local, D]
    if isinstance(value, (list, tuple)) and value and all(torch.is_tensor(v) for v in value):
        flat = torch.cat([v.reshape(-1, v.shape[-1]) for v in value])  # per-item [n_i, D] -> [N, D]
        return type(value)([flat[rows.to(flat.device)]])
    if isinstance(value, (list, tuple)):  # per layer (deepstack): each a per-item sequence
        return type(value)(_select(v, rows) for v in value)
    return value


def _check_counts(value: Any, items: torch.Tensor, name: str, advice: str | None = None) -> None:
    """Refuse an encoder output whose per-item feature counts are not the placeholders' (a family whose images do
    not all give the same number of features, which the batch's layout assumed)."""
    if torch.is_tensor(value):
        parts = value.shape[0] // len(items) if value.dim() == 3 and len(items) and \
            value.shape[0] % len(items) == 0 else 1  # an item encoded as equal parts (Video-LLaVA: its frames)
        got = [value.shape[1] * parts] * (value.shape[0] // parts) if value.dim() == 3 else [value.shape[0]]
        want = items.tolist() if value.dim() == 3 else [int(items.sum())]
    elif isinstance(value, (list, tuple)) and value and all(torch.is_tensor(v) for v in value):
        got, want = [v.reshape(-1, v.shape[-1]).shape[0] for v in value], items.tolist()
        if len(got) != len(want):  # one entry per batch row, not per item (Idefics: the row's images together)
            got, want = [sum(got)], [int(items.sum())]
    else:
        return
    if got != want:
        raise ValueError(f"the {name} encoder gave {got} feature rows per item where the placeholders say {want}: "
                         "either the documents' placeholders are not their processor's (tokenize each document with "
                         "the model's processor) or this family's items do not map to a fixed number of "
                         f"placeholders ({advice or 'train it with one document per row, packing off'})")


def select_rows(output: Any, rows: torch.Tensor, items: torch.Tensor | None = None, name: str = "image",
                exchange: Any = None, advice: str | None = None) -> Any:
    """Cut an encoder output (``pooler_output`` and deepstack features; ``last_hidden_state`` where it has no
    ``pooler_output``) to ``rows``.

    Args:
        output: what ``get_image_features(..., return_dict=True)`` returned.
        rows: ``[n_local]`` rows of the concatenated per-item features, in local token order.
        items: ``[n_items]`` placeholders of every local item (checked against the output), or ``None``.
        name: the modality (for the message; ``"audio"``: the fields of :func:`_audio_fields`).
        exchange: this rank's :class:`~.exchange.RowExchange` of the modality (rows encoded once elsewhere are
            received, after this rank's own, and its rows others need are sent), or ``None``.
        advice: the fix a refusal names (:func:`~.structure.fix`: the attention the model's sub-models take).

    Returns:
        ``output`` with those fields replaced (the same object).

    Raises:
        ValueError: the output's per-item counts differ from ``items``.
    """
    fields = _audio_fields(output) if name == "audio" else _SELECTED_FIELDS
    if getattr(output, fields[0], None) is None and getattr(output, "last_hidden_state", None) is not None:
        fields = ("last_hidden_state",)  # Fuyu merges its patch embeddings, the encoder's last hidden state
    if items is not None and getattr(output, fields[0], None) is not None:
        _check_counts(getattr(output, fields[0]), items, name, advice)
    if exchange is not None:
        exchange_rows(output, exchange, fields)
    for field_name in fields:
        value = getattr(output, field_name, None)
        if value is not None:
            setattr(output, field_name, _select(value, rows))
    return output


def keep_rows(output: Any, mask: torch.Tensor, name: str) -> Any:
    """An encoder output's ``pooler_output`` (one ``[rows_i, D]`` per item) with only the rows each item's keep mask
    marks (VideoLLaMA3's token compression, which its forward applies to all the items' rows at once).

    Args:
        output: what ``get_{name}_features(..., return_dict=True)`` returned; mask: ``[n_items, most rows]`` bool
            (``False`` past an item's rows); name: the modality (for the message).

    Returns:
        ``output`` with ``pooler_output`` replaced (the same object).

    Raises:
        ValueError: an output that is not one tensor per item, or a mask of other items.
    """
    value = getattr(output, "pooler_output", None)
    if not isinstance(value, (list, tuple)) or len(value) != mask.shape[0] or \
            any(v.shape[0] > mask.shape[1] or bool(mask[i, v.shape[0]:].any()) for i, v in enumerate(value)):
        got = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
        raise ValueError(f"the {name} encoder's output ({got} items) does not match its keep mask of shape "
                         f"{tuple(mask.shape)}: pack the documents with PackingCollator(max_length, "
                         "vision=hf_hsap.vision_spec(model)) and call model(**hf_hsap.shard_batch(batch, sp))")
    mask = mask.to(device=value[0].device, dtype=torch.bool)
    output.pooler_output = type(value)(v[mask[i, :v.shape[0]]] for i, v in enumerate(value))
    return output


class _Rows:
    """The rows of the forward in flight (set by the pre-hook, cleared after the forward).

    Args:
        family: the model type; image_blocks: its images attend bidirectionally (Gemma 3), so a forward with
            pixels must say where the images are (``hsap_blocks`` from ``shard_batch``, or ``token_type_ids``).
    """

    def __init__(self, family: str, image_blocks: bool, keep_keys: dict[str, str] | None = None,
                 out_mask_key: str | None = None, per_clip: bool = False) -> None:
        self.rows: dict[str, torch.Tensor] | None = None
        self.per_clip = per_clip  # a packed row's audio clips encoded one at a time (audio.encode_per_clip)
        self.out_mask_key = out_mask_key  # the forward's mask of the audio encoder's output rows (Granite Speech)
        self.out_mask: torch.Tensor | None = None  # this forward's: applied to the encoder's rows before the cut
        self.inside = False  # within a wrapped encoder call (Qwen3-VL's video path calls the image one)
        self.family, self.image_blocks = family, image_blocks
        self.advice: str | None = None  # the fix a refusal names (structure.fix of the model)
        self.keep_keys = keep_keys or {}  # modality -> its per-item keep mask's key (Modality.keep_key)
        self.keep: dict[str, torch.Tensor] = {}  # modality -> the forward's [n_items, rows] keep mask

    def pre(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if self.image_blocks and kwargs.get("pixel_values") is not None and kwargs.get("hsap_blocks") is None \
                and kwargs.get("token_type_ids") is None and PROBE_KEY not in kwargs:  # the probe's image: no blocks needed
            raise ValueError(
                f"{self.family}'s image tokens attend to each other bidirectionally, but this forward has pixels and "
                "neither hsap_blocks nor token_type_ids: they would be causal. Pack with PackingCollator(max_length, "
                "vision=hf_hsap.vision_spec(model)) and call model(**hf_hsap.shard_batch(batch, sp))")
        rows = kwargs.pop(ROWS_KEY, None)
        if rows is not None:
            self.rows = rows
        for name, key in self.keep_keys.items():  # a packed batch's per-item keep mask: applied by the encoder's wrap
            mask = kwargs.get(key)
            if torch.is_tensor(mask) and mask.dim() == 2:  # (the processor's own [rows] is left to the model)
                self.keep[name] = kwargs.pop(key)
        if rows is not None and self.out_mask_key is not None and kwargs.get(self.out_mask_key) is not None:
            self.out_mask = kwargs.pop(self.out_mask_key)  # applied here, before the rows are cut
        return args, kwargs

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.rows = None
        self.keep = {}
        self.out_mask = None


def _spec_or_none(model: torch.nn.Module) -> Any:
    try:
        return vision_spec(model)
    except ValueError:  # a family without packed-row support: its own refusal comes from vision_spec
        return None


def _runs(method: Any, rows: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Where an audio encoder reads its clips' placeholder runs from ``input_ids`` (MusicFlamingo): the encoded
    clips' placeholders and window indices (:func:`~.audio._encode_with_runs`); else ``None``."""
    if kwargs.get("input_ids") is None or rows.get(window_key("audio")) is None:
        return None
    return {"token_id": token(getattr(method, "__self__").config, *AUDIO_TOKENS),
            "tokens": rows[items_key("audio")], "windows": rows[window_key("audio")]}


def _wrap(method: Any, state: _Rows, name: str) -> Any:
    @functools.wraps(method)
    def features(*args: Any, **kwargs: Any) -> Any:
        # the decoder's plan and text inputs stay there (InstructBLIP-Video passes its forward's keyword arguments,
        # the packed row's position_ids too, on to its Q-Former, whose own text positions they are not)
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("hsap_") and k not in _DECODER_KEYS}
        if state.inside:
            return method(*args, **kwargs)
        state.inside = True
        try:
            if name == "audio" and state.per_clip and state.rows is not None:  # each clip as its document alone
                out = encode_per_clip(method, args, kwargs, runs=_runs(method, state.rows, kwargs))
            else:
                out = method(*args, **kwargs)
        finally:
            state.inside = False
        if name in state.keep:
            out = keep_rows(out, state.keep[name], name)
        rows = None if state.rows is None else state.rows.get(name)
        if rows is not None and name == "audio" and state.out_mask is not None:  # the rows the forward would keep
            out.pooler_output = out.pooler_output[state.out_mask.to(out.pooler_output.device).bool()]
        return out if rows is None else select_rows(out, rows, state.rows.get(items_key(name)), name,
                                                    state.rows.get(exchange_key(name)), advice=state.advice)
    return features


def prepare_vision(model: torch.nn.Module, changes: ModelChanges) -> bool:
    """Install the row selection on a vision-language model (called by ``prepare_model``).

    Args:
        model: the model the training loop calls (before DDP / FSDP wrapping).
        changes: the preparation's journal (``PreparedModel.undo()`` removes the wrappers and hooks).

    Returns:
        Whether ``model`` is a vision-language model (and now prepared).
    """
    inner = inner_vlm(model)
    if inner is None:
        return False
    if state_of(model, VISION_ROWS) is not None:
        return True
    spec = _spec_or_none(model)
    family = str(getattr(model.config, "model_type", type(model).__name__))
    keep = {} if spec is None else {m.name: m.keep_key for m in spec.layout.modalities if m.keep_key}
    inline = has_inline_audio(inner)  # Qwen2-Audio: given the get_audio_features its forward runs inline
    if inline:
        changes.set(inner, "get_audio_features", inline_audio_encoder(inner))
    audio = callable(getattr(inner, "get_audio_features", None))
    state = _Rows(family, spec is not None and spec.layout.image_blocks, keep,
                  output_mask_key(model, inner) if audio else None, per_clip=audio)
    for name, method in _FEATURE_METHODS.items():
        if callable(getattr(inner, method, None)):
            changes.set(inner, method, _wrap(getattr(inner, method), state, name))
    for m in {model, inner}:
        changes.hook(m.register_forward_pre_hook(state.pre, with_kwargs=True))
    if inline:  # after state.pre: the forward's clips encoded by the wrapped encoder, their rows placed
        changes.hook(inner.register_forward_pre_hook(inline_audio_pre(token(model.config, *AUDIO_TOKENS)),
                                                     with_kwargs=True))
    changes.hook(model.register_forward_hook(state.post, always_call=True))
    if spec is not None:
        prepare_indicators(model, inner, changes)  # Ovis 2.5: item boundary rows per token (.indicators)
    state.advice = fix(model)
    changes.put(model, VISION_ROWS, state)
    logger.info("prepare_vision: %s keeps only this rank's image / video feature rows", type(model).__name__)
    return True
