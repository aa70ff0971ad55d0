"""What crosses the boundary, as plain data: a value becomes a JSON-able tree plus named arrays
(:class:`Encoder`) and comes back as a fresh copy (:func:`decode`); what is not plain data crosses as an
:class:`Opaque` description, an object kept on the learner's side as a :class:`Handle`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .limits import MAX_DEPTH, MAX_ELEMENTS, MAX_ITEMS, MAX_TEXT, TimeUp
from .outcomes import ReplayMismatch


class Opaque:
    """A learner's value that is not plain data (a custom object): only its type and a short repr cross."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return f"<{self.type_name}: {self.text}>"


@dataclass(frozen=True)
class Handle:
    """A learner-side object the check keeps working with (e.g. a module built from the learner's class)."""

    id: int
    type_name: str


_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


class Encoder:
    """Turns values into a JSON-able tree plus named arrays (``a0``, ``a1``, …)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def _array(self, array: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.array(array, order="C", copy=True)  # (ascontiguousarray turns 0-d into 1-d)
        return key

    def encode(self, value: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            return {"t": "object", "type": type(value).__name__, "repr": "(nested too deeply)"}
        if value is None or isinstance(value, (bool, int, float, str)) and type(value) in (bool, int, float, str):
            if isinstance(value, str) and len(value) > MAX_TEXT:
                value = value[:MAX_TEXT] + "…"
            return {"t": "py", "v": value}
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufc":
                return {"t": "object", "type": f"ndarray[{value.dtype}]", "repr": f"shape {value.shape}"}
            if value.size > MAX_ELEMENTS:
                return {"t": "too_large", "type": "ndarray", "shape": list(value.shape)}
            return {"t": "ndarray", "a": self._array(value), "dtype": str(value.dtype), "shape": list(value.shape)}
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return {"t": "npscalar", "dtype": str(value.dtype), "v": value.item()}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": str(value).replace("torch.", "")}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        if isinstance(value, Handle):
            return {"t": "handle", "id": value.id, "type": value.type_name}
        if type(value) in (tuple, list, torch.Size):
            if len(value) > MAX_ITEMS:
                return {"t": "too_large", "type": type(value).__name__, "shape": [len(value)]}
            kind = "list" if type(value) is list else "tuple"
            return {"t": kind, "items": [self.encode(v, depth + 1) for v in value]}
        if type(value) is dict:
            if len(value) > MAX_ITEMS:
                return {"t": "too_large", "type": "dict", "shape": [len(value)]}
            return {"t": "dict", "items": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in value.items()]}
        return {"t": "object", "type": type_name(value), "repr": safe_repr(value)}

    def _tensor(self, t: torch.Tensor) -> dict:
        node: dict[str, Any] = {"t": "tensor", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                                "device": t.device.type, "grad": bool(t.requires_grad)}
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            node["sub"] = type_name(t)
        if t.numel() > MAX_ELEMENTS:
            return {**node, "t": "too_large", "type": "tensor"}
        if t.layout != torch.strided or t.dtype not in _DTYPES.values() or t.device.type == "meta":
            return node  # no data: the check says what it expected
        data = torch.Tensor.detach(t)
        data = torch.Tensor.cpu(data).resolve_conj().resolve_neg()
        if isinstance(data, torch.Tensor) and type(data) is not torch.Tensor:
            data = data.as_subclass(torch.Tensor)
        array = data.view(torch.int16).numpy() if data.dtype == torch.bfloat16 else data.numpy()
        node["a"] = self._array(array)
        return node


def type_name(value: Any) -> str:
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except TimeUp:
        raise
    except BaseException:  # noqa: BLE001 - a learner's __repr__ may do anything (it runs under the time limit)
        text = "(no repr)"
    return text if len(text) <= 200 else text[:199] + "…"


def decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Rebuild a value from :class:`Encoder`'s tree; tensors and arrays come back as fresh copies."""
    kind = node.get("t") if isinstance(node, dict) else None
    if kind == "py":
        return node["v"]
    if kind == "tensor":
        dtype = _DTYPES.get(node["dtype"])
        if "a" not in node or dtype is None:
            return torch.empty(node["shape"], device="meta") if node.get("device") == "meta" else \
                Opaque(f"tensor ({node.get('device')}, {node['dtype']})", "without readable data")
        array = np.array(arrays[node["a"]], copy=True)
        t = torch.from_numpy(array)
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        if list(t.shape) != list(node["shape"]) or t.dtype != dtype:
            raise ReplayMismatch("a recorded tensor does not match its description")
        return t
    if kind == "ndarray":
        array = np.array(arrays[node["a"]], copy=True)
        if str(array.dtype) != node["dtype"] or list(array.shape) != list(node["shape"]):
            raise ReplayMismatch("a recorded array does not match its description")
        return array
    if kind == "npscalar":
        return np.dtype(node["dtype"]).type(node["v"])
    if kind == "dtype":
        return _DTYPES.get(node["v"], node["v"])
    if kind == "device":
        return torch.device(node["v"])
    if kind == "handle":
        return Handle(int(node["id"]), str(node["type"]))
    if kind in ("tuple", "list"):
        items = [decode(v, arrays) for v in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        out = {}
        for k, v in node["items"]:
            key = decode(k, arrays)
            out[key if isinstance(key, (str, int, float, bool, type(None), tuple)) else repr(key)] = decode(v, arrays)
        return out
    if kind == "too_large":
        return Opaque(f"{node['type']} of shape {tuple(node['shape'])}", "too large to check")
    if kind == "object":
        return Opaque(str(node.get("type")), str(node.get("repr", "")))
    raise ReplayMismatch(f"unknown recorded value {kind!r}")


def digest(tree: Any, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode())
    for key in sorted(arrays):
        a = arrays[key]
        h.update(f"{key}:{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def describe_value(value: Any) -> str:
    """A short description: ``(2, 5) float32``, ``bool (4, 4)``, ``3``, ``None``."""
    if isinstance(value, torch.Tensor):
        kind = str(value.dtype).replace("torch.", "")
        return f"{kind} {tuple(value.shape)}" if value.dtype == torch.bool else f"{tuple(value.shape)} {kind}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.shape} {value.dtype}"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)) and len(value) <= 6 and all(isinstance(v, (int, float, bool)) for v in value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, Handle):
        return f"your {value.type_name} object"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def describe_args(name: str, args: tuple, kwargs: dict) -> str:
    """``attention(Q (2, 3, 4) float32, K …, mask=bool (3, 5))``: what a call was given."""
    shown = [describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"
