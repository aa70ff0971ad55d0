"""The one watcher of a learner's torch calls: ops, tensors built, matrix products and their FLOPs, exp tiles,
reductions (:class:`Watch`; :func:`watch` for the learner side of a probe)."""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Watch", "watch", "einsum_flops"]


_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "linalg_matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "linear",
             "addmm", "baddbmm", "addbmm", "addmv", "tensordot", "linalg_vecdot"}


_SECOND_OPERAND = {"addmm", "baddbmm", "addbmm", "addmv", "__rmatmul__"}  # the operand whose last axis is contracted


_REDUCTIONS = {"amax", "amin", "max", "min", "sum", "nansum", "mean", "logsumexp", "prod", "norm", "std", "var"}


_MAXIMA, _SUMS = {"amax", "max"}, {"sum", "nansum"}  # what a softmax's two reductions are written with
_MULTIPLIES = {"mul", "__mul__", "__rmul__", "multiply"}
_EXPS = {"exp", "exp_", "exp2", "exp2_"}


class Watch(TorchFunctionMode):
    """Sees every torch function that Python code calls while it is active (the autograd engine's own calls
    and C++ internals are not seen) and records:

    * ``ops`` — the functions' names; ``calls`` — how many times each ran;
    * ``largest`` / ``shape`` — the elements of the largest tensor storage returned, and that tensor's shape;
    * ``elements`` — the elements of every tensor returned, summed;
    * ``shapes`` — the shapes of the floating-point tensors (≥ 2-D) returned (at most 2000 kept);
    * ``products`` — how many matrix products (``@``, ``mm``, ``einsum``…) returned each shape, and ``flops``
      — their FLOPs, 2 per multiply–add (a product by broadcasting then summed,
      ``(a[..., :, None, :] * b[..., None, :, :]).sum(-1)``, counts too);
    * ``exp_elements`` / ``exp_tile`` / ``zero_tiles`` — what went through ``exp``: elements, the largest
      2-D tile, and how many tiles came out all zero (every score in them masked);
    * ``reductions`` — for max/sum-like reductions, how many inputs one output combined;
    * ``reduction_kinds`` — the order of the maxima (``m``) and sums (``s``) over more than one input: "msms…" is
      one pass (a sum after each maximum), "mm…ss…" two (every maximum before any sum).
    (A torch-function mode costs nothing to enter; PyTorch's FlopCounterMode imports torch._dynamo,
    seconds on a small machine.)"""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.calls: dict[str, int] = {}
        self.largest, self.shape, self.elements = 0, (), 0
        self.shapes: set[tuple[int, ...]] = set()
        self.products: dict[tuple[int, ...], int] = {}
        self.flops = 0.0
        self.exp_elements, self.exp_tile, self.zero_tiles = 0, (), 0
        self.reductions: set[int] = set()
        self.reduction_kinds: list[str] = []
        self._spread: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # products by broadcasting

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        self.ops.add(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        if outs and (name == "einsum" or name in _PRODUCTS):
            self._product(name, args, outs[0])
        elif outs and name in _MULTIPLIES and len(args) > 1 and all(isinstance(a, torch.Tensor) for a in args[:2]) \
                and outs[0].numel() > max(args[0].numel(), args[1].numel()):
            self._spread[id(outs[0])] = outs[0]  # a product by broadcasting: a matrix product if a sum follows
        if outs and name in _SUMS and args and self._spread.get(id(args[0])) is args[0]:
            # q[..., :, None, :] * k[..., None, :, :], then .sum(-1): a matrix product written out, counted as one
            # (a multiply and an add per entry of the product), so the work rules see it
            self.flops += 2.0 * args[0].numel()
        if outs and name in _REDUCTIONS and args and isinstance(args[0], torch.Tensor) and outs[0].numel():
            combined = args[0].numel() // outs[0].numel()
            if len(self.reductions) < 32:
                self.reductions.add(combined)
            kind = "m" if name in _MAXIMA else "s" if name in _SUMS else ""
            if kind and combined > 1 and len(self.reduction_kinds) < 256:
                self.reduction_kinds.append(kind)
        for t in outs:
            self._tensor(name, t)
        return out

    def _product(self, name: str, args: tuple, out: torch.Tensor) -> None:
        if out.dim() >= 2:
            self.products[tuple(out.shape)] = self.products.get(tuple(out.shape), 0) + 1
        if name == "einsum":
            self.flops += einsum_flops(args, out)
            return
        if name in ("tensordot", "linalg_vecdot") and len(args) > 1 and all(isinstance(a, torch.Tensor) for a in args[:2]):
            # a (free × c) and b (c × free) make out (free × free): c² = |a|·|b| / |out| (vecdot: out is what is left)
            c = math.sqrt(args[0].numel() * args[1].numel() / max(out.numel(), 1)) if name == "tensordot" else \
                args[0].shape[-1]
            self.flops += 2.0 * out.numel() * c
            return
        operand = args[1] if name in _SECOND_OPERAND and len(args) > 1 else (args[0] if args else None)
        if isinstance(operand, torch.Tensor) and operand.dim():
            self.flops += 2.0 * out.numel() * operand.shape[-1]

    def _tensor(self, name: str, t: torch.Tensor) -> None:
        self.elements += t.numel()
        try:
            size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        except Exception:  # noqa: BLE001 - tensors without a storage (sparse, meta…): count their elements
            size = t.numel()
        if size > self.largest:
            self.largest, self.shape = size, tuple(t.shape)
        if t.is_floating_point() and t.dim() >= 2 and len(self.shapes) < 2000:
            self.shapes.add(tuple(t.shape))
        if name in _EXPS and t.dim() >= 2:
            self.exp_elements += t.numel()
            if t.shape[-2] * t.shape[-1] > math.prod(self.exp_tile or (0,)):
                self.exp_tile = tuple(t.shape[-2:])
            if t.shape[-2] > 1 and t.shape[-1] > 1 and not bool(t.any()):
                self.zero_tiles += 1

    def report(self) -> dict[str, Any]:
        """What was seen, as plain JSON-able data (what a probe sends back across the learner boundary)."""
        return {"ops": sorted(self.ops), "calls": dict(sorted(self.calls.items())), "largest": int(self.largest),
                "shape": [int(s) for s in self.shape], "elements": int(self.elements),
                "shapes": [list(s) for s in sorted(self.shapes)],
                "products": [[list(s), c] for s, c in sorted(self.products.items())], "flops": float(self.flops),
                "exp_elements": int(self.exp_elements), "exp_tile": [int(s) for s in self.exp_tile],
                "zero_tiles": int(self.zero_tiles), "reductions": sorted(self.reductions),
                "reduction_kinds": "".join(self.reduction_kinds)}


def watch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run ``fn(*args, **kwargs)`` once under a :class:`Watch` and return its :meth:`~Watch.report` (the result
    itself is dropped). Meant for the learner side of a probe."""
    watcher = Watch()
    with watcher:
        fn(*args, **kwargs)
    return watcher.report()


def einsum_flops(args: tuple, out: torch.Tensor) -> float:
    """2 × (output entries) × (product of the contracted sizes) of an einsum; 0 when it cannot be read."""
    try:
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        inputs, output = equation.replace(" ", "").split("->")
        sizes: dict[str, int] = {}
        for spec, t in zip(inputs.split(","), operands):
            head, _, tail = spec.partition("...")
            sizes.update(zip(head, t.shape))
            sizes.update(zip(reversed(tail), reversed(t.shape)))
        return 2.0 * out.numel() * math.prod(s for letter, s in sizes.items() if letter not in output)
    except Exception:  # noqa: BLE001 - an equation this reader does not follow is not counted
        return 0.0
