"""A disk cache of the outputs of a frozen network, looked up by the content of each input.

A frozen backbone maps the same image to the same features in every epoch, so a method whose backbone is frozen
(all of it, or all but its last blocks) computes them once (:meth:`FeatureCache.build`, with a progress bar) and
then reads them. Lookup is by content, not by item index: every input image is reduced to a 64-bit fingerprint
(:func:`fingerprints`: random integer hashes of its 8-bit pixel values, computed exactly and independently of
the batch it comes in), so the method's forward pass stays the same whether an image is cached or
not; an input that is not in the table (an augmented image, a new dataset) is computed by the network as usual.

Before a file is written, one line on stderr says what, where and about how many bytes (the rows times the
first batch's output shape and the storage dtype); a file over ``$RLATTENTION_CACHE_LIMIT`` (default 2 GB) stops
the build after its first batch, writing nothing (:mod:`rlattention.cache_limit`).

On disk: ``<cache_dir>/features/<key>.safetensors`` holding ``keys`` (M,) int64 (sorted) and ``values``
(M, ...), where ``key`` is a SHA-256 of the network's weights, the preprocessing, the output storage dtype and the
input images themselves, so a change of any of them makes a new file. The file is written atomically (a
temporary file in the same folder, then a rename), never through a symlink, and carries a SHA-256 of its tensors
in its metadata; a damaged, truncated or foreign file is reported and rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

FORMAT = "rlattention.features/1"
_WEIGHT_SEED = 0x5EED_CAFE


_WEIGHTS: dict[tuple[int, str], tuple[Tensor, Tensor, Tensor]] = {}
_COLUMNS = 8


def _chunk(n: int) -> int:
    """The largest divisor of ``n`` up to 256: the length of the blocks summed exactly in float32."""
    return next(d for d in range(min(256, n), 0, -1) if n % d == 0)


def _weights(n: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Fixed (seeded) weights of :func:`fingerprints` for items of ``n`` values, cached per size and device:
    block weights ``(L, 8)`` float32 integers in [0, 256), per-block multipliers ``(n / L, 8)`` and column mixers
    ``(8,)``, odd random 64-bit integers."""
    key = (n, str(device))
    if key not in _WEIGHTS:
        g = torch.Generator().manual_seed(_WEIGHT_SEED)
        L = _chunk(n)
        w1 = torch.randint(0, 256, (L, _COLUMNS), generator=g).float()
        w2 = torch.randint(-(2**62), 2**62, (n // L, _COLUMNS), generator=g, dtype=torch.int64) | 1
        mix = torch.randint(-(2**62), 2**62, (_COLUMNS,), generator=g, dtype=torch.int64) | 1
        if len(_WEIGHTS) > 8:
            _WEIGHTS.clear()
        _WEIGHTS[key] = (w1.to(device), w2.to(device), mix.to(device))
    return _WEIGHTS[key]


def fingerprints(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-item 64-bit fingerprints of ``(B, ...)`` images: uint8 (0..255) or float in [0, 1].

    Returns ``(keys, exact)``: int64 ``(B,)`` and bool ``(B,)``. ``exact[b]`` is False for a float item that is
    not an 8-bit image (checked on a fixed sample of every 61st value: a value farther than 1e-3 / 255 from a
    multiple of 1/255), whose key must not be used.

    The 8-bit values ``q`` are cut into blocks of ``L <= 256``; each block is reduced by 8 random integer weights
    below 256 in one float32 matrix product, exact because every sum stays below 2^24; the block sums are then
    combined with random odd 64-bit multipliers in wrapping integer arithmetic. Exact in any batch and summation
    order; two different images share a key with probability below about 2^-60.
    """
    B = len(x)
    flat = x.reshape(B, -1)
    n = flat.shape[1]
    w1, w2, mix = _weights(n, x.device)
    with torch.autocast(x.device.type, enabled=False):  # a bf16 / fp16 matmul would round the exact sums
        if flat.dtype == torch.uint8:
            q = flat.float()
            exact = torch.ones(B, dtype=torch.bool, device=x.device)
        else:
            sample = flat[:, ::61].float() * 255.0
            exact = (sample - sample.round()).abs().amax(dim=1) <= 1e-3
            q = torch.mul(flat.float(), 255.0).round_()
        L = w1.shape[0]
        blocks = (q.view(B * (n // L), L) @ w1).view(B, n // L, _COLUMNS).long()  # exact integers < 2^24
    return ((blocks * w2).sum(dim=1) * mix).sum(dim=1), exact  # wraps modulo 2^64


def tensor_digest(t: Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    c = t.detach().cpu().contiguous().reshape(-1)
    h.update(c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return h.hexdigest()


def module_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state (parameters and buffers, by name)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        if isinstance(t, Tensor):
            h.update(name.encode())
            h.update(tensor_digest(t).encode())
    return h.hexdigest()


def _payload_digest(keys: Tensor, values: Tensor) -> str:
    return hashlib.sha256((tensor_digest(keys) + tensor_digest(values)).encode()).hexdigest()


class FeatureCache:
    """The cached outputs of one frozen network on one set of inputs.

    ``fn``: the frozen network, ``(B, ...)`` float inputs in [0, 1] -> ``(B, ...)`` features; ``describe``:
    a string naming everything besides the weights that changes the output (preprocessing, layer, input size).
    """

    def __init__(
        self, fn: Callable[[Tensor], Tensor], module: torch.nn.Module, describe: str, dtype: torch.dtype = torch.float16
    ) -> None:
        self.fn, self.module, self.describe, self.dtype = fn, module, describe, dtype
        self.keys: Tensor | None = None  # sorted (M,)
        self.values: Tensor | None = None  # (M, ...)
        self.hits = 0
        self.misses = 0
        self.path: Path | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else len(self.keys)

    def file_for(self, inputs: Tensor, cache_dir: str | os.PathLike) -> Path:
        parts = {
            "format": FORMAT,
            "weights": module_digest(self.module),
            "describe": self.describe,
            "dtype": str(self.dtype),
            "inputs": tensor_digest(inputs),
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]
        return Path(cache_dir).expanduser() / "features" / f"{key}.safetensors"

    @torch.no_grad()
    def build(
        self,
        inputs: Tensor,
        cache_dir: str | os.PathLike | None,
        batch_size: int = 64,
        progress: bool = True,
        device: torch.device | str | None = None,
        what: str = "features",
    ) -> FeatureCache:
        """Features of every distinct item of ``inputs`` (uint8 ``(N, ...)``), read from ``cache_dir`` if a valid
        file is there, else computed (with a progress bar: :func:`rlattention.progress.progress_bar`, shown when
        ``progress``, on rank 0, on a terminal) and written there (``cache_dir=None``: memory only). A file to be
        written is announced after the first batch, or refused over the cache limit
        (:class:`~rlattention.cache_limit.CacheTooLarge`, nothing written). The items of an earlier build stay in
        the table."""
        if inputs.dtype != torch.uint8:
            raise ValueError(f"feature cache inputs must be uint8 images (0..255), got {inputs.dtype}")
        keys = torch.cat([fingerprints(inputs[i : i + 256])[0] for i in range(0, len(inputs), 256)])
        keys, first = _unique_first(keys)
        inputs = inputs[first]
        path = None if cache_dir is None else self.file_for(inputs, cache_dir)
        loaded = _read(path, len(keys)) if path is not None and path.exists() else None
        if loaded is not None and torch.equal(loaded[0], keys):
            values = loaded[1]
        else:
            announce = None if path is None else (lambda shape: self._announce(path, len(keys), shape, what))
            values = self._compute(inputs, batch_size, progress, device, what, announce)
            if path is not None:
                _write(path, keys, values)
        self.path = path
        self._merge(keys, values)
        return self

    def _announce(self, path: Path, rows: int, shape: tuple[int, ...], what: str) -> None:
        """The announcement (or refusal) of a file of ``rows`` keys (int64) and values ``(rows, *shape)``."""
        from rlattention.cache_limit import announce_cache_build

        itemsize = torch.empty((), dtype=self.dtype).element_size()
        nbytes = rows * (8 + math.prod(shape) * itemsize)
        dtype = str(self.dtype).removeprefix("torch.")
        announce_cache_build(
            f"caching {what} of {rows:,} images ({' x '.join(map(str, shape)) or 'one value'} {dtype} each)",
            path,
            nbytes,
            "keep the features in memory with model.feature_cache=memory (computed at every run, nothing written)",
        )

    def _compute(self, inputs: Tensor, batch_size: int, progress: bool, device, what: str, announce=None) -> Tensor:
        """``fn`` of every item, in batches; ``announce(shape)`` is called with the per-item output shape once
        the first batch is computed, before the others."""
        from rlattention.progress import progress_bar

        if device is None:
            device = next(iter(self.module.parameters()), torch.empty(0)).device
        out: Tensor | None = None
        with progress_bar(total=len(inputs), desc=f"caching {what}", unit="img", enabled=progress) as bar:
            for start in range(0, len(inputs), batch_size):
                x = inputs[start : start + batch_size].to(device).float().div_(255.0)
                y = self.fn(x).to("cpu", self.dtype)
                if out is None:
                    if announce is not None:
                        announce(tuple(y.shape[1:]))
                    out = torch.empty((len(inputs), *y.shape[1:]), dtype=self.dtype)
                out[start : start + len(y)] = y
                bar.update(len(y))
        assert out is not None
        return out

    def _merge(self, keys: Tensor, values: Tensor) -> None:
        if self.keys is not None:
            keep = ~torch.isin(self.keys, keys)
            keys = torch.cat((self.keys[keep], keys))
            values = torch.cat((self.values[keep], values))
        order = torch.argsort(keys)
        self.keys, self.values = keys[order], values[order]

    def lookup(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Rows of the table for the items of ``x``: ``(index (B,), hit (B,))``."""
        keys, exact = fingerprints(x)
        if self.keys is None or len(self.keys) == 0:
            return torch.zeros_like(keys), torch.zeros_like(exact)
        table = self.keys.to(keys.device)
        idx = torch.searchsorted(table, keys).clamp_(max=len(table) - 1)
        return idx, (table[idx] == keys) & exact

    def __call__(self, x: Tensor) -> Tensor:
        """``fn(x)``, with every cached item read from the table and the others computed."""
        idx, hit = self.lookup(x)
        n_hit = int(hit.sum())
        self.hits += n_hit
        self.misses += len(x) - n_hit
        if n_hit == 0:
            return self.fn(x)
        values = self.values
        cached = values[idx[hit].to(values.device)].to(x.device, torch.float32)
        if n_hit == len(x):
            return cached
        fresh = self.fn(x[~hit])
        out = torch.empty((len(x), *fresh.shape[1:]), dtype=fresh.dtype, device=x.device)
        out[hit] = cached.to(fresh.dtype)
        out[~hit] = fresh
        return out


def _unique_first(keys: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted distinct keys and the index of each one's first occurrence."""
    uniq, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((len(uniq),), len(keys), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(keys)), reduce="amin")
    return uniq, first


def _read(path: Path, expected: int) -> tuple[Tensor, Tensor] | None:
    """The file's (keys, values), or None (with a warning) when it is damaged or not ours."""
    from safetensors import safe_open

    try:
        if path.is_symlink():
            raise ValueError("is a symlink")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            # copies: a mapping of the file would break if someone truncated it while we train
            keys, values = f.get_tensor("keys").clone(), f.get_tensor("values").clone()
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        if len(keys) != expected or len(values) != expected:
            raise ValueError(f"{len(keys)} rows, expected {expected}")
        if meta.get("sha256") != _payload_digest(keys, values):
            raise ValueError("checksum mismatch")
    except Exception as e:  # noqa: BLE001 - any damage means: rebuild
        warnings.warn(f"feature cache {path} is damaged ({type(e).__name__}: {e}); rebuilding it", stacklevel=3)
        return None
    return keys, values


def _write(path: Path, keys: Tensor, values: Tensor) -> None:
    from safetensors.torch import save_file

    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():
        raise ValueError(f"feature cache folder {folder} is a symlink: refusing to write through it")
    tmp = folder / f".{path.name}.tmp-{os.getpid()}"
    meta = {"format": FORMAT, "sha256": _payload_digest(keys, values)}
    try:
        save_file({"keys": keys.contiguous(), "values": values.contiguous()}, str(tmp), metadata=meta)
        if path.is_symlink():
            path.unlink()  # replace the link itself, never its target
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
