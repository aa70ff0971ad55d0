"""The one watcher of a learner's torch calls: ops, tensors built, the memory they hold at once, matrix products
and their FLOPs, exp tiles, reductions and which numbers of an input they read (:class:`Watch`; :func:`watch` for
the learner side of a probe)."""

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


_SUMS = {"sum", "nansum"}  # what a product by broadcasting is summed with
# a maximum or a sum written otherwise: kind (m: max, s: sum, l: logsumexp) and where the reduced axis is (its
# positional index, default): the whole axis is combined (cummax's last value, topk's first, cumsum's last)
_ALONG = {"cummax": ("m", 1, None), "cummin": ("m", 1, None),
          "topk": ("m", 2, -1), "sort": ("m", 1, -1), "msort": ("m", 9, 0), "kthvalue": ("m", 2, -1),
          "cumsum": ("s", 1, None), "logcumsumexp": ("l", 1, None)}
_POOLS = {"max_pool1d", "max_pool2d", "max_pool3d"}
_BY_ONES = {"matmul", "__matmul__", "__rmatmul__", "linalg_matmul", "mm", "bmm", "mv", "dot", "vdot", "inner"}
_MULTIPLIES = {"mul", "__mul__", "__rmul__", "multiply"}
_EXPS = {"exp", "exp_", "exp2", "exp2_"}
# the kinds of reductions (m: a maximum, also a minimum, as of −x; s: a sum; l: a logsumexp)
_READS = {"amax": "m", "max": "m", "amin": "m", "min": "m", "sum": "s", "nansum": "s", "logsumexp": "l"}
# out-of-place functions whose output entry i comes from input entry i (an input of the output's shape)
_ELEMENTWISE = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "subtract", "mul", "__mul__", "__rmul__",
                "multiply", "div", "__truediv__", "__rtruediv__", "divide", "true_divide", "neg", "__neg__", "negative",
                "exp", "exp2", "expm1", "log", "log1p", "abs", "clamp", "clamp_min", "clamp_max", "clip", "maximum",
                "minimum", "fmax", "fmin", "where", "masked_fill", "nan_to_num", "pow", "__pow__", "square", "sqrt",
                "logaddexp", "double", "float", "half", "bfloat16", "to", "type", "clone", "contiguous", "detach"}
# in-place functions that keep each entry where it was (others, copy_ and __setitem__ first, rewrite the entries)
_ELEMENTWISE_INPLACE = {"add_", "sub_", "mul_", "div_", "exp_", "exp2_", "neg_", "clamp_", "clamp_min_", "clamp_max_",
                        "masked_fill_", "nan_to_num_", "abs_", "log_", "sqrt_", "pow_", "subtract_", "multiply_",
                        "divide_", "true_divide_", "__iadd__", "__isub__", "__imul__", "__itruediv__"}
# functions that only move entries (copy, select, pad, join): run again on the index, they say where each went
_STRUCTURAL = {"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "__getitem__", "index_select",
               "gather", "take_along_dim", "flip", "fliplr", "flipud", "roll", "reshape", "flatten", "ravel", "repeat",
               "tile", "pad", "narrow_copy", "masked_select"}
_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                    "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}


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
      one pass (a sum after each maximum), "mm…ss…" two (every maximum before any sum);
    * ``live_peak`` / ``live_count`` / ``live_shapes`` — memory held at once: the most bytes of tensor storages
      created while watched that were alive at the same time (each storage counted once, however many views of
      it; the storages of ``inputs`` and tensors returned as they are not counted), how many storages that was,
      and the shapes they were made with (``[shape, count, bytes]``, most bytes first, at most 3);
    * ``reads`` (with a ``source`` tensor) — which numbers of the source the max, sum and logsumexp reductions
      read, followed through elementwise functions (``exp(x[..., a:b] − m).sum()`` reads x[..., a:b]):
      ``most`` — the most times one number was read by maxima (``m``), by sums (``s``), by logsumexp (``l``);
      ``back`` — the first reduction that went back to numbers the loop had moved on from (numbers read before,
      then other numbers read since): ``[kind, how many numbers, index of the reduction among those that
      read the source, the kinds of the reductions between its numbers' last read and it]``, or None when
      every number's reads follow each other (one pass); ``sizes`` — how many inputs one output of those
      reductions combined. Maxima and sums written otherwise count as what they are (cummax, topk, sort, max
      pooling, amin of −x; cumsum, ``e @ ones``, einsum); ``copy_`` and ``t[key] = …`` carry the numbers they
      write.
    (A torch-function mode costs nothing to enter; PyTorch's FlopCounterMode imports torch._dynamo,
    seconds on a small machine.)"""

    def __init__(self, source: torch.Tensor | None = None, inputs: tuple = ()) -> None:
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
        self.live, self.live_peak, self.live_count, self.live_shapes = 0, 0, 0, []
        self._alive: dict[int, tuple[int, tuple[int, ...], weakref.finalize]] = {}  # data_ptr -> bytes, shape, …
        self._by_shape: dict[tuple[int, ...], list[int]] = {}  # shape -> [storages alive, their bytes]
        self._old = {p for p in map(_storage_ptr, _tensors(inputs)) if p}  # the inputs' storages: not created here
        self._reads = _Reads(source) if isinstance(source, torch.Tensor) else None

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            for _, _, finalizer in list(self._alive.values()):
                finalizer.detach()  # storages outliving the watch hold nothing of it
            self._alive.clear()
            if self._reads is not None:
                self._reads.close()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        self.ops.add(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        # under torch.func.vmap (or grad) a tensor's values cannot be read: only its shape is watched
        reads = self._reads if self._reads is not None and not any(map(_wrapped, outs)) else None
        if reads is not None:
            reads.follow(func, name, args, kwargs or {}, outs)
        if outs and (name == "einsum" or name in _PRODUCTS):
            self._product(name, args, outs[0])
        elif outs and name in _MULTIPLIES and len(args) > 1 and all(isinstance(a, torch.Tensor) for a in args[:2]) \
                and outs[0].numel() > max(args[0].numel(), args[1].numel()):
            self._spread[id(outs[0])] = outs[0]  # a product by broadcasting: a matrix product if a sum follows
        if outs and name in _SUMS and args and self._spread.get(id(args[0])) is args[0]:
            # q[..., :, None, :] * k[..., None, :, :], then .sum(-1): a matrix product written out, counted as one
            # (a multiply and an add per entry of the product), so the work rules see it
            self.flops += 2.0 * args[0].numel()
        found = _reduction(name, args, kwargs or {}, outs) if outs and args else None
        if found is not None:
            kind, combined, read = found
            if len(self.reductions) < 32:
                self.reductions.add(combined)
            if kind in ("m", "s") and combined > 1 and len(self.reduction_kinds) < 256:
                self.reduction_kinds.append(kind)
            if reads is not None and kind and combined > 1:
                reads.read(kind, read, combined)
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
            storage = t.untyped_storage()
            size = storage.nbytes() // max(t.element_size(), 1)
        except Exception:  # noqa: BLE001 - tensors without a storage (sparse, meta…): count their elements
            storage, size = None, t.numel()
        if storage is not None:
            self._born(storage, tuple(t.shape))
        if size > self.largest:
            self.largest, self.shape = size, tuple(t.shape)
        if t.is_floating_point() and t.dim() >= 2 and len(self.shapes) < 2000:
            self.shapes.add(tuple(t.shape))
        if name in _EXPS and t.dim() >= 2:
            self.exp_elements += t.numel()
            if t.shape[-2] * t.shape[-1] > math.prod(self.exp_tile or (0,)):
                self.exp_tile = tuple(t.shape[-2:])
            if t.shape[-2] > 1 and t.shape[-1] > 1 and not _wrapped(t) and not bool(t.any()):
                self.zero_tiles += 1

    def _born(self, storage: Any, shape: tuple[int, ...]) -> None:
        """Count a storage first seen now among those alive (until it is freed), and the peak of their bytes."""
        try:
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if not ptr or not nbytes or ptr in self._alive or ptr in self._old or len(self._alive) >= 100_000:
                return
            self._alive[ptr] = (nbytes, shape, weakref.finalize(storage, self._freed, ptr))
        except Exception:  # noqa: BLE001 - a storage that cannot be watched (no weak reference): not counted
            return
        self.live += nbytes
        held = self._by_shape.setdefault(shape, [0, 0])
        held[0], held[1] = held[0] + 1, held[1] + nbytes
        if self.live > self.live_peak:
            self.live_peak, self.live_count = self.live, len(self._alive)
            top = sorted(self._by_shape.items(), key=lambda item: -item[1][1])[:3]
            self.live_shapes = [[list(s), c, b] for s, (c, b) in top]

    def _freed(self, ptr: int) -> None:
        nbytes, shape, _ = self._alive.pop(ptr, (0, (), None))
        self.live -= nbytes
        held = self._by_shape.get(shape)
        if held is not None and nbytes:
            held[0], held[1] = held[0] - 1, held[1] - nbytes
            if held[0] <= 0:
                del self._by_shape[shape]

    def report(self) -> dict[str, Any]:
        """What was seen, as plain JSON-able data (what a probe sends back across the learner boundary)."""
        return {"ops": sorted(self.ops), "calls": dict(sorted(self.calls.items())), "largest": int(self.largest),
                "shape": [int(s) for s in self.shape], "elements": int(self.elements),
                "shapes": [list(s) for s in sorted(self.shapes)],
                "products": [[list(s), c] for s, c in sorted(self.products.items())], "flops": float(self.flops),
                "exp_elements": int(self.exp_elements), "exp_tile": [int(s) for s in self.exp_tile],
                "zero_tiles": int(self.zero_tiles), "reductions": sorted(self.reductions),
                "reduction_kinds": "".join(self.reduction_kinds), "live_peak": int(self.live_peak),
                "live_count": int(self.live_count), "live_shapes": self.live_shapes,
                **({"reads": self._reads.report()} if self._reads is not None else {})}


def watch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run ``fn(*args, **kwargs)`` once under a :class:`Watch` and return its :meth:`~Watch.report` (the result
    itself is dropped). Meant for the learner side of a probe. The arguments' storages are the inputs (not
    counted as memory the function holds)."""
    watcher = Watch(inputs=(args, kwargs))
    with watcher:
        fn(*args, **kwargs)
    return watcher.report()


def _reduction(name: str, args: tuple, kwargs: dict, outs: list) -> tuple[str, int, torch.Tensor] | None:
    """A max- or sum-like reduction: its kind ("m", "s", "l", or "" for others), how many inputs one output
    combines, and the tensor it reads; None for any other function. Maxima and sums written with other functions
    count as what they are: cummax, topk, sort, kthvalue, max pooling (maxima, ``amin`` of −x too), cumsum
    and logcumsumexp (sums), a product with a tensor of ones (``e @ ones``, ``einsum("...i,i->...", e, ones)``)
    and an einsum of one operand that drops an index (sums) — each over more than one input (a length-1 axis
    reduces nothing)."""
    t, out = args[0], outs[0]
    try:
        if name in _ALONG and isinstance(t, torch.Tensor):
            kind, at, dim = _ALONG[name]
            dim = kwargs.get("dim", args[at] if len(args) > at and isinstance(args[at], int) else dim)
            if dim is not None and t.dim() and t.shape[dim] > 1:
                return kind, int(t.shape[dim]), t
        if name in _REDUCTIONS and isinstance(t, torch.Tensor) and out.numel():
            return _READS.get(name, ""), t.numel() // out.numel(), t
        if name in _POOLS and isinstance(t, torch.Tensor):
            size = kwargs.get("kernel_size", args[1] if len(args) > 1 else 1)
            size = math.prod(size) if isinstance(size, (tuple, list)) else int(size)
            return ("m", size, t) if size > 1 else None
        if name == "einsum" and out.numel():
            operands = args[1:]
            if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
                operands = tuple(operands[0])
            rest = [o for o in operands if not _ones(o)]
            combined = int(einsum_flops(args, out) // (2 * out.numel()))
            if len(rest) == 1 and isinstance(rest[0], torch.Tensor) and combined > 1:
                return "s", combined, rest[0]
        if name in _BY_ONES and len(args) > 1 and all(isinstance(a, torch.Tensor) for a in args[:2]):
            a, b = (args[1], args[0]) if name == "__rmatmul__" else args[:2]
            summed = a if _ones(b) else b if _ones(a) else None
            if summed is not None and a.dim() and a.shape[-1] > 1:
                return "s", int(a.shape[-1]), summed
    except Exception:  # noqa: BLE001 - a call this reader does not follow is no reduction
        return None
    return None


def _ones(t: Any) -> bool:
    """A floating-point tensor of ones (what a sum written as a product multiplies by)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and 0 < t.numel() <= 1 << 16 and not _wrapped(t) \
        and bool((t == 1).all())


def _wrapped(t: torch.Tensor) -> bool:
    """A tensor inside torch.func.vmap or grad, whose values Python cannot read (only its shape)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a value, in tuples, lists and dicts (not deeper than that)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - no storage (sparse, meta…)
        return 0


class _Reads:
    """Which numbers of one source tensor each reduction reads. Every storage holding numbers that come, entry for
    entry, from the source (its own, and the outputs of elementwise functions of it) has an index: for each
    element of the storage, the source number it holds (−1: none). A reduction whose input has one reads the
    numbers its view of the index shows. One pass, row by row (the rows of the source's last axis are
    independent: a loop may visit them one after the other or side by side): once a reduction has read numbers
    of a row that no earlier one had, the numbers of that row read before and not by it are behind the loop, and
    a later reduction reading them goes back."""

    _MAX_EVENTS = 4096

    def __init__(self, source: torch.Tensor) -> None:
        self.size, self.width = source.numel(), (source.shape[-1] if source.dim() else 1) or 1
        self.index: dict[int, tuple[torch.Tensor, int]] = {}  # data_ptr -> (source number per element, itemsize)
        self.events: list[torch.Tensor] = []  # the numbers each reduction read (sorted, unique)
        self.kinds: list[str] = []  # and its kind
        self.sizes: set[int] = set()  # how many inputs one output of a reduction that read the source combined
        self.last = torch.full((self.size,), -1, dtype=torch.long)  # the last reduction that read each number
        self.counts = {k: torch.zeros(self.size, dtype=torch.long) for k in "msl"}
        self.back: list | None = None
        self._finalizers: dict[int, weakref.finalize] = {}
        try:
            self._index_of(source, torch.arange(self.size).view(source.shape), source=True)
        except Exception:  # noqa: BLE001 - a source without a readable storage: nothing is followed
            pass

    def _index_of(self, t: torch.Tensor, numbers: torch.Tensor, *, source: bool = False) -> None:
        """Give ``t``'s storage an index: ``numbers`` where ``t`` lies in it, −1 elsewhere; dropped when the storage
        is freed (another storage may come to the same address)."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        index = torch.full((storage.nbytes() // max(t.element_size(), 1),), -1, dtype=torch.long)
        index.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(numbers)
        if not source:  # the source outlives the watch
            self._finalizers[ptr] = weakref.finalize(storage, self.forget, ptr)
        self.index[ptr] = (index, t.element_size())

    def numbers(self, t: Any) -> torch.Tensor | None:
        """The source number each entry of ``t`` holds (−1: none), shaped like ``t``; None if it holds none."""
        if not isinstance(t, torch.Tensor):
            return None
        found = self.index.get(_storage_ptr(t))
        if found is None or found[1] != t.element_size():
            return None
        try:
            return found[0].as_strided(t.shape, t.stride(), t.storage_offset())
        except Exception:  # noqa: BLE001 - a view this index cannot show
            return None

    def forget(self, ptr: int) -> None:
        self.index.pop(ptr, None)
        finalizer = self._finalizers.pop(ptr, None)
        if finalizer is not None:
            finalizer.detach()

    def close(self) -> None:
        for ptr in list(self._finalizers):
            self.forget(ptr)

    def follow(self, func: Callable[..., Any], name: str, args: tuple, kwargs: dict, outs: list) -> None:
        """Give the output of an elementwise function the index of its input (when every input of the output's
        shape holds the same numbers); drop the index of a storage an in-place function rewrote."""
        if name in ("copy_", "__setitem__") and len(args) > 1 + (name == "__setitem__") and not kwargs:
            self._write(args[0], args[1:2] if name == "copy_" else args[1:3])
            return
        written = [kwargs["out"]] if isinstance(kwargs.get("out"), torch.Tensor) else []
        inplace = name in _INPLACE_DUNDERS or name == "__setitem__" or name.endswith("_") and not name.endswith("__")
        if inplace and name not in _ELEMENTWISE_INPLACE:
            written += [a for a in args[:1] if isinstance(a, torch.Tensor)]
        for t in written:
            self.forget(_storage_ptr(t))
        if (name not in _ELEMENTWISE and name not in _STRUCTURAL) or written or not outs:
            return
        out = outs[0]
        if _storage_ptr(out) in self.index or not out.numel():
            return  # the input itself or a view of it (x.double() of a float64 x, a reshape): it has its index
        try:
            if name in _STRUCTURAL:  # the same function on the indices (−1 for numbers from elsewhere)
                held = self._indices((args, kwargs))
                if held is None:
                    return
                numbers = func(*held[0], **held[1])
                if isinstance(numbers, torch.Tensor) and numbers.shape == out.shape and bool((numbers >= 0).any()):
                    self._index_of(out, numbers)
                return
            found = [n for n in map(self.numbers, [*args, *kwargs.values()]) if n is not None and n.shape == out.shape]
            if found and all(torch.equal(found[0], n) for n in found[1:]):
                self._index_of(out, found[0])
        except Exception:  # noqa: BLE001 - a call the index cannot follow: its output is not followed
            pass

    def _write(self, t: Any, call: tuple) -> None:
        """``t.copy_(src)`` or ``t[key] = src``: the entries written hold the numbers ``src`` holds (broadcast as
        the write does), −1 where it holds none; the rest of ``t``'s storage keeps its index."""
        if not isinstance(t, torch.Tensor):
            return
        src = call[-1]
        numbers = self.numbers(src)
        ptr, found = _storage_ptr(t), self.numbers(t)
        if numbers is None and found is None:
            return  # nothing followed is written, nor overwritten
        try:
            if found is None:
                self._index_of(t, torch.full(t.shape, -1, dtype=torch.long))
                found = self.numbers(t)
            if len(call) == 1:
                found.copy_(numbers.expand(t.shape) if numbers is not None else torch.tensor(-1))
            else:
                key = call[0]
                found[key] = numbers if numbers is not None else -1
        except Exception:  # noqa: BLE001 - a write this index cannot follow: the storage is no longer followed
            self.forget(ptr)

    def _indices(self, call: tuple[tuple, dict]) -> tuple[tuple, dict] | None:
        """``(args, kwargs)`` with each tensor replaced by the source numbers it holds (−1 where none; integer
        and bool tensors, indices and masks, as they are); None when no tensor holds any."""
        held = []

        def swap(a: Any) -> Any:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                numbers = self.numbers(a)
                if numbers is not None:
                    held.append(a)
                    return numbers
                return torch.full(a.shape, -1, dtype=torch.long)
            if isinstance(a, (tuple, list)):
                return type(a)(swap(v) for v in a)
            return a

        args, kwargs = swap(call[0]), {k: -1 if k == "value" else swap(v) for k, v in call[1].items()}
        return (args, kwargs) if held else None

    def read(self, kind: str, t: torch.Tensor, combined: int = 0) -> None:
        """A reduction of ``kind`` ("m", "s", "l") over ``t``: count the numbers it reads, and whether it goes back."""
        numbers = self.numbers(t)
        if numbers is None or len(self.events) >= self._MAX_EVENTS:
            return
        read = torch.unique(numbers[numbers >= 0])
        if not read.numel():
            return
        if len(self.sizes) < 32:
            self.sizes.add(int(combined))
        self.counts[kind][read] += 1
        now, before = len(self.events), self.last[read]
        again = before >= 0
        if self.back is None and bool(again.any()):
            mine = torch.zeros(self.size, dtype=torch.bool)
            mine[read] = True
            rows, since = read[again] // self.width, before[again]
            for s in range(int(since.min()) + 1, now):
                other = self.events[s][~mine[self.events[s]]]  # numbers reduction s read and this one does not
                if not other.numel():
                    continue
                moved = torch.zeros(self.size // self.width + 1, dtype=torch.bool)
                moved[other // self.width] = True  # the rows in which the loop moved on at s
                behind = moved[rows] & (since < s)  # numbers read before s, in those rows, read again now
                if bool(behind.any()):
                    self.back = [kind, int(behind.sum()), now, "".join(self.kinds[int(since.min()) + 1:now])[:16]]
                    break
        self.last[read] = now
        self.events.append(read)
        self.kinds.append(kind)

    def report(self) -> dict[str, Any]:
        return {"most": {k: int(c.max()) if c.numel() else 0 for k, c in self.counts.items()}, "back": self.back,
                "sizes": sorted(self.sizes)}


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
