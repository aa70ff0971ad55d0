"""What an exception means: the course-wide table of the errors learners' tensor code raises most often, each
with its cause in the second person and a fix (:func:`explain_exception`). A topic's own constructs and patterns
come first (:func:`~.kit.raises.explain_raise`); this table answers when they do not, and
:func:`~.core.learner_error` uses it for any learner's exception."""

from __future__ import annotations

import re

__all__ = ["explain_exception"]

#: (type, pattern of the message, cause, fix): what the errors learners' tensor code raises most often mean.
#: Groups of the pattern may be used in the cause and fix ({1}, {2}...). Checked in order; the first match wins.
_EXCEPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("NameError", r"name '(\w+)' is not defined",
     "`{1}` is used before anything is assigned to it: the line that computes it is missing, comes later, or "
     "spells the name differently",
     "compute `{1}` before the line that uses it (or correct the spelling)"),
    ("UnboundLocalError", r"'?(\w+)'? (?:referenced before assignment|where it is not associated with a value)",
     "`{1}` is used before anything is assigned to it: the line that computes it is missing or comes later",
     "compute `{1}` before the line that uses it"),
    ("NameError", r"cannot access free variable '(\w+)'",
     "`{1}` is used (in a generator expression or inner function) before anything is assigned to it",
     "compute `{1}` before the line that uses it"),
    ("RuntimeError", r"upper bound and lower bound inconsistent with step sign",
     "a torch.arange(start, end, step) whose step leads away from end: its arguments are in another order, or start "
     "lies beyond end", "print the arange's arguments: it counts from start up to end (excluded)"),
    ("RuntimeError", r"step must be nonzero", "a step of 0 in torch.arange or a slice",
     "use a step of 1 (or 2 to take every other one)"),
    ("RuntimeError", r"Boolean value of Tensor", "Python asked a tensor of several values for one True/False (`if`, "
     "`while`, `and`, `or`, `not`, any(...) over tensors): it has none",
     "reduce the comparison to one bool first: torch.equal(a, b), torch.allclose(a, b) or (a == b).all(); test for "
     "None with `is not None`"),
    ("RuntimeError", r"If you are trying to invert a mask", "- does not negate a bool mask",
     "negate it with ~mask (or mask.logical_not())"),
    ("RuntimeError", r"atol must be greater than or equal to zero", "a negative tolerance", "use atol=1e-5"),
    ("RuntimeError", r"clamp: At least one of 'min' or 'max' must not be None",
     "clamp() was called with neither min nor max (a clamp without its bound), so it has no bound to apply",
     "give the bound: .clamp(min=0) or .clamp(max=B - 1)"),
    ("RuntimeError", r"permute\(\): duplicate dims", "a permute that names one axis twice: each axis must appear "
     "exactly once", "list every axis once: .permute(2, 0, 1) turns (n, n, A) into (A, n, n)"),
    ("RuntimeError", r"diagonal dimensions cannot be identical (-?\d+), (-?\d+)",
     "diagonal() was given one axis twice: dim1 = {1} and dim2 = {2} are the same axis, and a diagonal runs over two "
     "different axes", "take the diagonal over the last two axes: w.diagonal(dim1=-2, dim2=-1)"),
    ("RuntimeError", r"Sizes of tensors must match except in dimension (-?\d+)", "torch.cat joins tensors along "
     "axis {1}, and every other axis must agree: they do not (the join is along another axis than meant, or "
     "one tensor lost or gained an axis)", "print the shapes you join, and join along the axis the docstring grows"),
    ("RuntimeError", r"The expanded size of the tensor \((-\d+)\) must match", "you gave expand the size {1}: "
     "expand takes the new size of each axis, or -1 to keep one as it is; no other negative number",
     "write -1 for each axis that keeps its size, and the size itself (e.g. T) for the axis you expand"),
    ("TypeError", r"bad operand type for unary ~: 'NoneType'", "`~` applied to None: the mask is None (its "
     "default) and was inverted without a test", "test `if mask is not None:` before using the mask"),
    ("TypeError", r"tuple of ints,? ?but (?:got|found element of type) float",
     "a size that is a float where PyTorch needs whole numbers: `/` always gives a float (12 / 3 is 4.0)",
     "compute sizes with integer division, `//` (or int(...))"),
    ("TypeError", r"'([<>=!]+)' not supported between instances of '([\w.]+)' and '([\w.]+)'",
     "a comparison ({1}) between values of types {2} and {3}: one side is not the number or tensor it should be (a "
     "name holds a {2})", "print the value of both sides on the line shown"),
    ("AttributeError", r"'torch.Size' object has no attribute '(\w+)'", "you called .{1} on a shape (a torch.Size, "
     "such as mask.shape), which is a tuple of sizes, not a tensor",
     "make a tensor of that shape first: torch.zeros(mask.shape, dtype=dtype).{1}(…)"),
    ("RuntimeError", r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton dimension (\d+)",
     "two tensors combined entry by entry (+, −, ×, ÷, where) have shapes that do not fit together: sizes {1} and {2} "
     "meet on one axis, so the two operands' axes do not line up (an axis lost or added on the way, or axes in "
     "another order)",
     "print the shapes of both operands on the line shown and make their axes line up"),
    ("RuntimeError", r"mat1 and mat2 shapes cannot be multiplied \((\w+) and (\w+)\)",
     "a matrix product whose inner sizes differ ({1} @ {2}): an operand is transposed the wrong way, or the "
     "product is written in the wrong order",
     "for A @ B the last size of A must equal the first (matrix) size of B: transpose the right operand, or swap them"),
    ("RuntimeError", r"(?:Expected size for first two dimensions of batch2 tensor|batch1 and batch2 shapes cannot be "
                     r"multiplied|shapes cannot be multiplied|size mismatch)",
     "a matrix product whose inner sizes differ: an operand is transposed the wrong way, or the product is "
     "written in the wrong order", "print both operands' shapes; for A @ B the last size of A must equal B's "
     "second-to-last"),
    ("IndexError", r"Dimension out of range \(expected to be in range of \[(-?\d+), (-?\d+)\], but got (-?\d+)\)",
     "an axis number the tensor does not have (axis {3}, where it has axes {1} to {2}): the tensor has fewer "
     "axes than the code expects (one was removed earlier), or the axis number is wrong",
     "print the tensor's shape on the line shown and use an axis it has (−1 is the last)"),
    ("RuntimeError", r"The expanded size of the tensor \((\d+)\) must match the existing size \((\d+)\) at "
                     r"non-singleton dimension (\d+)",
     "a tensor of size {2} on one axis is broadcast into (or assigned to) a place of size {1} there: the value "
     "written into a slice (x[...] = value) and the slice have different shapes, or an .expand to other sizes",
     "print the shapes of the slice and of the value on the line shown and make them agree"),
    ("RuntimeError", r"expand\([^)]*\): the number of sizes provided \((\d+)\) must be greater or equal to the "
                     r"number of dimensions in the tensor \((\d+)\)",
     "a tensor with {2} axes is broadcast into (or assigned to) a place with only {1}: the value written into a "
     "slice (x[...] = value) has more axes than the slice (an axis not summed away, or a keepdim=True too many)",
     "print the shapes of the slice and of the value on the line shown and make them agree"),
    ("RuntimeError", r"both arguments to matmul need to be at least 1D, but they are (\d)D and (\d)D",
     "a matrix product with a 0-D operand (a single number, {1}-D @ {2}-D): @ needs vectors or matrices on both "
     "sides, so a step reduced a tensor to one number (a sum over every axis?) or a number stands where a tensor "
     "was meant", "print both operands' shapes; for a number times a tensor use *"),
    ("RuntimeError", r"stack expects a non-empty TensorList",
     "torch.stack got an empty list: nothing was appended to it (the append is missing, or the loop never ran)",
     "append each result inside the loop, and check that the loop runs over every item"),
    ("RuntimeError", r"stack expects each tensor to be equal size",
     "torch.stack got tensors of different shapes: the items collected in the loop differ in shape",
     "make every item the same shape before stacking (print their shapes)"),
    ("TypeError", r"unsupported operand type\(s\) for ([^:]+): '(torch\.Size|tuple)' and '(torch\.Size|tuple)'",
     "an operation ({1}) between two shapes (a torch.Size is a tuple of sizes): shapes are not numbers, the only "
     "arithmetic they take is + (joining them) and * by an integer (repeating them)",
     "join shapes with + (q.shape[:-1] + (d,)); to compute with sizes, pick them out first (q.shape[-1])"),
    ("TypeError", r"can only concatenate tuple \(not \"?(\w+)\"?\) to (?:torch\.Size|tuple)",
     "a shape (a torch.Size, a tuple of sizes) + a {1}: + joins a shape only to another tuple, so one side holds a "
     "shape where a tensor was meant (a torch.zeros(shape) left out?) or the reverse",
     "print the type of both sides on the line shown"),
    ("TypeError", r"'([\w.]+)' object does not support item assignment",
     "an assignment into an entry of a {1}, which cannot be changed: the name holds a {1} where a tensor was meant "
     "(a torch.zeros(shape) or torch.empty(shape) left out?)",
     "print the type of the value you assign into on the line shown; create the tensor first"),
    ("TypeError", r"slice indices must be integers",
     "a slice bound that is not an integer: a / division (which gives a float) or a tensor where a[i:j] needs ints",
     "compute slice bounds with integers only (// for division, int(...) around a tensor)"),
    ("TypeError", r"only integer tensors of a single element can be converted to an index",
     "a tensor used as an index, a slice bound or a size where Python needs one integer: the tensor is a float "
     "tensor or holds more than one number",
     "print the value on the line shown: where an index or size is needed, pass a Python int"),
    ("TypeError", r"(\w+)\(\): argument '(\w+)' \(position (\d+)\) must be ([\w. ]+), not ([\w.]+)",
     "{1}() got a {5} as its argument `{2}` (position {3}), which must be {4}: a name holds something other than "
     "you think, or the arguments are in another order",
     "compare the call on the line shown with {1}'s documentation and print the argument"),
    ("TypeError", r"unsupported operand type\(s\) for ([^:]+): '([\w.]+)' and '([\w.]+)'",
     "an operation ({1}) between {2} and {3} values: one side is not the tensor it should be (a step that should "
     "produce a tensor gave a plain number, a shape or None)",
     "print the type of both sides on the line shown; each must be a tensor"),
    ("TypeError", r"'(\w+)' object is not (?:callable|subscriptable|iterable)",
     "a value of type {1} used as if it were a function, a tensor or a list: a name holds something other than "
     "you think",
     "print the value on the line shown and check which name holds it"),
    ("TypeError", r"(\w+)\(\) (?:missing \d+ required|takes \d+ positional|got an unexpected keyword|received an "
                  r"invalid combination)",
     "{1}() was called with arguments it does not take (a wrong number, order or name of arguments)",
     "compare the call on the line shown with {1}'s documentation"),
    ("IndexError", r"(\w+)\(\): Expected reduction dim (-?\d+) to have non-zero size",
     "{1}() over axis {2}, which has size 0: the tensor is empty along it, so a slice selected nothing (bounds "
     "past the end, or start ≥ stop)",
     "print the shape of the tensor on the line shown and check the slice bounds that built it"),
    ("IndexError", r"index (-?\d+) is out of bounds for dimension (\d+) with size (\d+)",
     "an index ({1}) past the end of an axis of size {3}: a loop or index runs one step too far",
     "make the loop or index stop before the axis's size (range(n) ends at n − 1)"),
    ("IndexError", r"(?:list index out of range|index out of range|too many indices)",
     "an index past the end of a list or tensor (or more indices than it has axes)",
     "print the length or shape of what you index on the line shown"),
    ("RuntimeError", r"(?:shape '\[[^\]]*\]' is invalid for input of size \d+|view size is not compatible)",
     "a view or reshape to sizes that do not hold the tensor's entries (or a .view of a transposed tensor)",
     "check the sizes you reshape to (their product must be the number of entries); after a transpose use .reshape"),
    ("RuntimeError", r"(?:expected (?:scalar type|m1 and m2 to have the same dtype|both vectors to have same dtype)|"
                     r"dtype|Found dtype)",
     "two tensors of different dtypes (e.g. float32 and float64, or an integer tensor) meet in one operation",
     "create new tensors with the inputs' dtype (dtype=x.dtype), and keep every step in floating point"),
    ("RuntimeError", r"(?:number of dims|dimension specified as|Expected \d+-dimensional|must be a matrix|"
                     r"1D tensors expected|expected 2D)",
     "a function got a tensor with a different number of axes than it takes (torch.dot and torch.mm take 1-D and "
     "2-D tensors only)", "use @ (torch.matmul), which handles any number of leading axes, or reshape first"),
    ("RuntimeError", r"(?:a leaf Variable that requires grad|modified by an inplace operation)",
     "an in-place change (+=, [...] =, .add_) of a tensor that autograd still needs",
     "write the step out of place (x = x + y), or work on a copy"),
    ("ZeroDivisionError", r".*", "a division by zero: a count or a size that is 0 here",
     "check what you divide by on the line shown"),
    ("RecursionError", r".*", "the function calls itself without end", "remove the call of the function inside itself"),
    ("AttributeError", r"module '([\w.]+)' has no attribute '(\w+)'",
     "{1}.{2} does not exist: the module {1} has nothing named {2} (misspelt, or it belongs to another module: "
     "torch has functions that math does not)",
     "look the function up in the module's documentation, or use the torch function of that name"),
    ("AttributeError", r"'(\w+)' object has no attribute '(\w+)'",
     "`.{2}` used on a value of type {1}, which has no such attribute: a value is not the type you expect (or the name is "
     "misspelt)", "print the value on the line shown; check its type and the attribute's spelling"),
    ("ValueError", r"(?:too many values to unpack|not enough values to unpack)",
     "an unpacking (a, b = ...) of something with a different number of items", "check how many items the "
     "right-hand side holds"),
)


def explain_exception(type_name: str, message: str) -> tuple[str, str] | None:
    """(cause, fix) for an exception the learner's code raised, when its type and message say what it means
    (a shape mismatch, an axis that does not exist, a name used before it is assigned...); None otherwise."""
    for kind, pattern, cause, fix in _EXCEPTIONS:
        if kind != type_name:
            continue
        match = re.search(pattern, message or "")
        if match:
            groups = [match.group(0), *match.groups()]
            fill = lambda text: re.sub(r"\{(\d)\}", lambda m: str(groups[int(m.group(1))] or ""), text)  # noqa: E731
            return fill(cause), fill(fix)
    return None
