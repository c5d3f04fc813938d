"""Phase 1 as phase 2 reads it: the frozen triplet networks and the gallery embeddings e_i, loaded from a
``phase1.safetensors`` artifact (:func:`load_phase1`) or from a phase-2 checkpoint (:func:`phase1_from_state`),
with a content-keyed memo of their outputs for the partial renders of the splits (:class:`PartialMemo`), and
:class:`Phase2Method`, what ``darp`` and ``darp_policy`` share on top of it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlattention.engine.method import DataInfo
from rlattention.methods.darp.layout import SketchRetrievalMethod, completion_steps
from rlattention.methods.darp.phase1 import (
    PHASE1_FILE,
    PHASE1_FORMAT,
    TripletConfig,
    TripletNetwork,
    first_occurrence,
)
from rlattention.vision.feature_cache import fingerprints, module_digest


def extra_state_optional(load):
    """A module's ``_load_from_state_dict`` that accepts a state without the module's ``_extra_state`` (written
    before the module recorded one): a strict load then does not report it missing."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args) -> None:
        load(self, state_dict, prefix, local_metadata, strict, missing_keys, *args)
        if prefix + "_extra_state" in missing_keys:
            missing_keys.remove(prefix + "_extra_state")

    return _load_from_state_dict


class PartialMemo:
    """A content-keyed memo of one frozen phase-1 output of single partial renders (the sketch embedding, or the
    pooled features before it): filled once for every partial of the splits, then read by the 64-bit fingerprint
    of each requested render (:func:`rlattention.vision.feature_cache.fingerprints`). A render that is not an
    exact 8-bit image (checked on every pixel: e.g. a rotated one) or not in the table is computed by the network
    and not stored. Plain tensors, not buffers: never in a state_dict or a checkpoint; the table moves to the
    device of the renders on first use there."""

    def __init__(self, weights: str) -> None:
        self.weights = weights  # module_digest of the phase-1 networks the values were computed with
        self.keys = torch.empty(0, dtype=torch.long)  # (M,) sorted
        self.values: Tensor | None = None  # (M, ...)
        self.hits = 0  # renders read from the table
        self.misses = 0  # renders computed by the network

    def __len__(self) -> int:
        return len(self.keys)

    @torch.no_grad()
    def fill(
        self, chunks: Iterable[Tensor], fn: Callable[[Tensor], Tensor], device: torch.device, batch_size: int = 256
    ) -> PartialMemo:
        """Add ``fn`` (renders ``(B, S, H, W)`` -> ``(B, S, ...)``) of every distinct render of ``chunks`` (uint8
        ``(N, H, W)`` tensors), each computed once, in batches of ``batch_size`` on ``device``."""
        keys, values = [self.keys.cpu()], [] if self.values is None else [self.values.to(device)]
        for renders in chunks:
            k, first = first_occurrence(_fingerprints(renders)[0])
            new = ~torch.isin(k, torch.cat(keys))
            k, first = k[new], first[new]
            for idx in first.split(batch_size) if len(first) else ():
                x = renders[idx].to(device).float().div_(255.0)  # as the batch loader converts uint8 images
                values.append(fn(x[:, None])[:, 0])
            keys.append(k)
        if len(values) == 0:
            return self
        keys_cat, values_cat = torch.cat(keys), torch.cat(values)
        order = torch.argsort(keys_cat)
        self.keys, self.values = keys_cat[order].to(device), values_cat[order.to(device)]
        return self

    def __call__(self, sketches: Tensor, fn: Callable[[Tensor], Tensor], dtype: torch.dtype) -> Tensor:
        """``fn(sketches)`` (renders ``(B, S, H, W)``) as ``dtype``: table rows for the memoised renders, ``fn``
        on the others."""
        B, S = sketches.shape[:2]
        flat = sketches.flatten(0, 1)  # (N, H, W)
        if self.values is None or len(flat) == 0:
            self.misses += len(flat)
            return fn(sketches).to(dtype)
        keys, exact = _fingerprints(flat)
        if flat.is_floating_point():  # fingerprints samples every 61st value; the memo checks them all
            exact &= _eight_bit(flat)
        if self.keys.device != flat.device:
            self.keys, self.values = self.keys.to(flat.device), self.values.to(flat.device)
        idx = torch.searchsorted(self.keys, keys).clamp_(max=len(self.keys) - 1)
        hit = exact & (self.keys[idx] == keys)
        n_hit = int(hit.sum())
        self.hits += n_hit
        self.misses += len(flat) - n_hit
        if n_hit == len(flat):
            out = self.values[idx].to(dtype)
        else:
            out = torch.empty((len(flat), *self.values.shape[1:]), dtype=dtype, device=flat.device)
            out[hit] = self.values[idx[hit]].to(dtype)
            out[~hit] = fn(flat[~hit][:, None])[:, 0].to(dtype)
        return out.view(B, S, *out.shape[1:])


def _fingerprints(x: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`fingerprints` outside any autocast (a bf16 matmul would round its exact integer sums), of float32
    values (float64 too)."""
    with torch.autocast(x.device.type, enabled=False):
        return fingerprints(x if x.dtype in (torch.uint8, torch.float32) else x.float())


def _eight_bit(x: Tensor) -> Tensor:
    """``(N, ...)`` float -> ``(N,)`` bool: every value within 1e-3 / 255 of a multiple of 1/255 (in blocks of
    about 1 MB, ten times faster than one pass over a large batch)."""
    flat = x.reshape(len(x), -1)
    worst = []
    for part in flat.split(max(1, 2**18 // max(1, flat.shape[1]))):
        scaled = part * 255.0
        worst.append(scaled.sub_(scaled.round()).abs_().amax(1))
    return torch.cat(worst) <= 1e-3


class Phase1(nn.Module):
    """The frozen phase-1 networks and gallery that phase-2 methods read. Always in eval mode (BatchNorm uses
    its running statistics), no parameter is trained. ``memos``: :class:`PartialMemo` of the outputs that
    :meth:`partials` serves, filled by :meth:`memoize`; dropped when a state load changes the networks."""

    def __init__(self, triplet: TripletNetwork, gallery: Tensor, present: Tensor) -> None:
        super().__init__()
        self.net = triplet
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.register_buffer("gallery", gallery)  # e_i of every photo (D,)
        self.register_buffer("present", present)
        self.net.eval()
        self.memos: dict[str, PartialMemo] = {}  # a plain attribute: not part of the module's state
        self.register_load_state_dict_post_hook(_drop_stale_memos)

    def train(self, mode: bool = True) -> Phase1:
        super().train(False)
        return self

    @torch.no_grad()
    def memoize(self, output: str, parts: Iterable[Any], chunk: int = 64) -> PartialMemo | None:
        """Memoise ``net.<output>`` (``embed_sketches`` or ``sketch_features``) of every partial render of the
        splits ``parts`` (uint8 items ``(N, S + 3, H, W)``; float items: nothing exact to key, None)."""
        parts = list(parts)
        if any(s.images.dtype != torch.uint8 for s in parts):
            return None
        digest = module_digest(self.net)
        memo = self.memos.get(output)
        if memo is None or memo.weights != digest:
            memo = self.memos[output] = PartialMemo(digest)
        steps = self.net.steps
        chunks = (s.images[i : i + chunk, :steps].flatten(0, 1) for s in parts for i in range(0, len(s), chunk))
        return memo.fill(chunks, getattr(self.net, output), self.gallery.device)

    @torch.no_grad()
    def partials(self, sketches: Tensor, output: str) -> Tensor:
        """``net.<output>`` of renders ``(B, S, H, W)`` in [0, 1] -> ``(B, S, ...)``, read from its memo where
        :meth:`memoize` filled one."""
        fn = getattr(self.net, output)
        memo = self.memos.get(output)
        return fn(sketches) if memo is None else memo(sketches, fn, self.gallery.dtype)

    # the phase-1 architecture travels in every phase-2 checkpoint (``phase1._extra_state``), so a checkpoint
    # can be evaluated or resumed without the phase1.safetensors it was trained from (see phase1_from_state)
    def get_extra_state(self) -> dict[str, str]:
        return {"format": PHASE1_FORMAT, "model_config": json.dumps(asdict(self.net.cfg))}

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or state.get("format") != PHASE1_FORMAT:
            raise ValueError(f"phase1._extra_state: expected a {PHASE1_FORMAT!r} record, got {state!r:.200}")
        if json.loads(state["model_config"]) != json.loads(json.dumps(asdict(self.net.cfg))):
            raise ValueError(
                f"the checkpoint's phase-1 networks were built with {state['model_config']}, this model's with "
                f"{json.dumps(asdict(self.net.cfg))}"
            )

    _load_from_state_dict = extra_state_optional(nn.Module._load_from_state_dict)


def _drop_stale_memos(phase1: Phase1, incompatible: Any) -> None:
    """After a state load: forget the memos computed with other phase-1 weights."""
    if phase1.memos:
        digest = module_digest(phase1.net)
        phase1.memos = {k: m for k, m in phase1.memos.items() if m.weights == digest}


def phase1_from_state(state: dict[str, Any], info: DataInfo, prefix: str = "phase1.") -> Phase1 | None:
    """The phase-1 networks and gallery stored in a phase-2 checkpoint's weights ``state``, or None when the
    checkpoint predates the stored architecture record."""
    record = state.get(prefix + "_extra_state")
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("format") != PHASE1_FORMAT or "model_config" not in record:
        raise ValueError(f"{prefix}_extra_state: expected a {PHASE1_FORMAT!r} record, got {record!r:.200}")
    gallery, present = state.get(prefix + "gallery"), state.get(prefix + "present")
    if gallery is None or present is None:
        raise ValueError(f"the checkpoint has no {prefix}gallery / {prefix}present tensors")
    if gallery.shape[0] != info.num_classes:
        raise ValueError(
            f"the checkpoint's phase-1 gallery has {gallery.shape[0]} photos, this dataset {info.num_classes}"
        )
    triplet = TripletNetwork(TripletConfig(**json.loads(record["model_config"])), info, load_weights=False)
    net = {k.removeprefix(prefix + "net."): v for k, v in state.items() if k.startswith(prefix + "net.")}
    try:
        triplet.load_state_dict(net)
    except RuntimeError as err:
        raise ValueError(f"the checkpoint's phase-1 networks do not match their recorded config: {err}") from None
    return Phase1(triplet, gallery.float(), present.bool())


def load_phase1(path: str | os.PathLike, info: DataInfo) -> Phase1:
    """Read a ``phase1.safetensors`` artifact (or the run folder holding it) and check it fits ``info``."""
    from safetensors import safe_open

    p = Path(path)
    if p.is_dir():
        p = p / PHASE1_FILE
    if not str(path):
        raise ValueError("model.phase1 is empty: give the phase1.safetensors written by a darp_triplet run")
    if not p.is_file():
        raise FileNotFoundError(f"model.phase1: {p} not found; train phase 1 first (method darp_triplet)")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as err:  # a truncated or foreign file
        raise ValueError(f"{p}: not a readable safetensors file ({type(err).__name__}: {err})") from None
    if meta.get("format") != PHASE1_FORMAT:
        raise ValueError(f"{p}: format {meta.get('format')!r}, expected {PHASE1_FORMAT!r} (a darp_triplet artifact)")
    if int(meta["num_photos"]) != info.num_classes:
        raise ValueError(
            f"{p}: written for {meta['num_photos']} photos (dataset {meta.get('dataset')!r}) but this dataset has "
            f"{info.num_classes}: phase 1 and phase 2 must use the same dataset"
        )
    if int(meta["completion_steps"]) != completion_steps(info):
        raise ValueError(
            f"{p}: written for {meta['completion_steps']} completion steps, the data has {completion_steps(info)}"
        )
    cfg = TripletConfig(**json.loads(meta["model_config"]))
    triplet = TripletNetwork(cfg, info, load_weights=False)
    state = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    try:
        triplet.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{p}: the networks do not match their recorded config: {err}") from None
    return Phase1(triplet, tensors["gallery"].float(), tensors["present"].bool())


class Phase2Method(SketchRetrievalMethod):
    """A method trained on top of a frozen phase 1 (``darp``, ``darp_policy``): built with the phase-1 artifact of
    ``model.phase1``, or from the copy its checkpoint carries; ``train_row`` (the gallery row of each training
    photo) set when fitting starts. ``phase1_output``: what it reads of each partial (memoised with
    ``model.phase1_cache``)."""

    phase1_output = "embed_sketches"

    @classmethod
    def from_config(cls, cfg: Any, info: DataInfo) -> Phase2Method:
        return cls(cfg, info, load_phase1(cfg.phase1, info))

    @classmethod
    def from_checkpoint(cls, cfg: Any, info: DataInfo, state: dict[str, Any]) -> Phase2Method:
        """Phase 1 from the checkpoint itself (``model.phase1`` is not read), or from the file for checkpoints
        written before the checkpoint recorded it."""
        phase1 = phase1_from_state(state, info)
        return cls(cfg, info, phase1) if phase1 is not None else cls.from_config(cfg, info)

    def on_fit_start(self, splits: Any) -> None:
        ids = torch.unique(splits.train.targets.long())
        if not bool(self.phase1.present[ids].all()):
            raise ValueError("model.phase1: the artifact has no embedding for some training photos")
        row = torch.full_like(self.train_row, -1)
        row[ids] = torch.arange(len(ids))
        self.train_row.copy_(row)
        self.phase1.net.on_fit_start(splits)  # a frozen pretrained phase 1: its features of every partial, cached
        if self.cfg.phase1_cache:  # training partials rotated at every step are never exact images: left out
            rotated = getattr(self.cfg, "augment_degrees", 0.0) > 0
            self.phase1.memoize(self.phase1_output, [splits.val, splits.test] + ([] if rotated else [splits.train]))


def training_gallery(model: nn.Module) -> Tensor:
    """The phase-1 embeddings of the training photos, in photo order (= ``train_row`` order): computed once per
    device and cached, so the training step does no boolean-mask indexing (a host sync on accelerators)."""
    key = (model.train_row.device, model.train_row._version, model.phase1.gallery._version)
    if getattr(model, "_gallery_key", None) != key:
        model._gallery = model.phase1.gallery[model.train_row >= 0]
        model._gallery_key = key
    return model._gallery
