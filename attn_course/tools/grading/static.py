"""What the grader learns from a cell's source without running it.

Compiling is not running: :func:`syntax_error` compiles a cell (IPython syntax such as ``%timeit``
or ``!ls`` translated first, as IPython would) and reports the line of a syntax error, so "a missing
``)``" is reported as exactly that, not as the NameError it leads to later. :func:`defines` says
whether a cell defines a name; :func:`bound_names` / :func:`used_names` let the planner find a
demonstration cell that an answer depends on.

:func:`suspicious` looks for what an honest answer never needs and a dishonest one usually does:
the course's own reference code, ``exec``/``eval``/``compile``/``__import__``, ``importlib``,
``sys.modules`` and frame tricks, IPython hooks (custom exception handlers, input transformers),
``ctypes``, ``gc``, shell commands and subprocesses, the grader's environment. A hit is a *flag*
for the instructor to look at, never a verdict: obfuscated code can hide from any such list.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from dataclasses import dataclass

__all__ = ["Syntax", "python_source", "syntax_error", "defines", "bound_names", "used_names", "suspicious",
           "course_names", "reference_uses"]


@dataclass(frozen=True)
class Syntax:
    line: int | None
    message: str

    def text(self) -> str:
        return f"syntax error in line {self.line}: {self.message}" if self.line else f"syntax error: {self.message}"


def python_source(source: str) -> str:
    """The cell as the Python IPython would compile (magics and ``!`` lines translated)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython could not translate it: compile the text as it is
        return source


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(python_source(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def syntax_error(source: str) -> Syntax | None:
    """The cell's syntax error (line within the cell, message), or None when it compiles."""
    try:
        compile(python_source(source), "<cell>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Syntax(exc.lineno, exc.msg or "invalid syntax")
    except (ValueError, RecursionError, MemoryError) as exc:
        return Syntax(None, f"the cell cannot be compiled ({type(exc).__name__})")
    return None


def bound_names(source: str) -> set[str]:
    """Names a cell binds at its top level (definitions, assignments, imports, loop targets)."""
    tree = _parse(source)
    if tree is None:
        return set()
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)

    for node in tree.body:
        for sub in [node, *_nested_statements(node)]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for alias in sub.names:
                    names.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(sub, ast.Assign):
                for t in sub.targets:
                    targets(t)
            elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                targets(sub.target)
            elif isinstance(sub, (ast.For, ast.AsyncFor)):
                targets(sub.target)
            elif isinstance(sub, (ast.With, ast.AsyncWith)):
                for item in sub.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
    return names


def _nested_statements(node: ast.AST) -> list[ast.AST]:
    """Statements inside top-level if/for/while/with/try blocks (still module level), not in functions."""
    out = []
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, []) or []:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                if not isinstance(node, ast.Module):
                    out.append(child)
                continue
            if isinstance(child, ast.stmt) or isinstance(child, ast.excepthandler):
                out.append(child)
                out.extend(_nested_statements(child))
    return out


def used_names(source: str) -> set[str]:
    """Global names a cell reads, at its top level or inside its functions and classes (parameters and
    local variables are not), minus builtins: what the cell needs some other cell to define."""
    try:
        table = symtable.symtable(python_source(source), "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found: set[str] = set()
    stack = [table]
    while stack:
        scope = stack.pop()
        top = scope.get_type() == "module"
        for symbol in scope.get_symbols():
            if symbol.is_referenced() and (symbol.is_global() or (top and not symbol.is_imported())):
                found.add(symbol.get_name())
        stack.extend(scope.get_children())
    return found - set(dir(builtins))


def defines(source: str, name: str) -> bool:
    return name in bound_names(source)


# ---------------------------------------------------------------------------------------- flags
_CALLS = {"exec": "uses exec()", "eval": "uses eval()", "compile": "uses compile()", "__import__": "uses __import__()",
          "globals": "uses globals()", "get_ipython": "uses get_ipython()", "breakpoint": "uses breakpoint()"}
_MODULES = {"importlib": "imports importlib", "ctypes": "imports ctypes", "gc": "imports gc",
            "builtins": "imports builtins", "subprocess": "starts subprocesses", "multiprocessing": "starts processes",
            "signal": "imports signal", "marshal": "imports marshal", "pickle": "imports pickle",
            "IPython": "imports IPython", "runpy": "imports runpy", "socket": "opens sockets",
            "inspect": "imports inspect", "sys": None, "os": None}
#: attribute -> (the name it must be read from, or None for any, flag)
_ATTRIBUTES = {
    "modules": ("sys", "touches sys.modules"), "meta_path": ("sys", "touches sys.meta_path"),
    "path_hooks": ("sys", "touches sys.path_hooks"), "_getframe": ("sys", "inspects frames (sys._getframe)"),
    "settrace": ("sys", "sets a trace function"), "setprofile": ("sys", "sets a profile function"),
    "addaudithook": ("sys", "adds an audit hook"), "excepthook": ("sys", "replaces sys.excepthook"),
    "set_custom_exc": (None, "sets an IPython exception handler"),
    "input_transformers_post": (None, "adds an IPython input transformer"),
    "input_transformers_cleanup": (None, "adds an IPython input transformer"),
    "ast_transformers": (None, "adds an IPython AST transformer"),
    "register_magic_function": (None, "defines magics"),
    "system": ("os", "runs shell commands (os.system)"), "popen": ("os", "runs shell commands (os.popen)"),
    "fork": ("os", "forks processes"), "forkpty": ("os", "forks processes"), "kill": ("os", "sends signals"),
    "killpg": ("os", "sends signals"), "execv": ("os", "replaces the process (os.exec*)"),
    "execve": ("os", "replaces the process (os.exec*)"), "execvp": ("os", "replaces the process (os.exec*)"),
    "_exit": ("os", "ends the process (os._exit)"), "environ": ("os", "reads or changes environment variables"),
    "putenv": ("os", "changes environment variables"), "savez": (None, "writes .npz files"),
    "savez_compressed": (None, "writes .npz files"), "__code__": (None, "rewrites function code"),
    "__builtins__": (None, "touches __builtins__"), "__globals__": (None, "reaches a function's globals"),
    "f_globals": (None, "reaches a frame's globals"), "f_back": (None, "walks frames"),
    "__subclasses__": (None, "walks class hierarchies"), "__torch_function__": (None, "overrides torch functions"),
    "__dict__": (None, "reaches an object's __dict__"),
}
_STRINGS = ("attn_course", "ATTN_COURSE", ".npz", "check_", "vnd.attn-course")


def suspicious(source: str, *, allowed_imports: frozenset[str] = frozenset()) -> list[str]:
    """Short flags for what in ``source`` an honest answer does not need (see the module docstring).

    ``allowed_imports`` are the ``attn_course`` names the course's own cells import (using those is fine)."""
    flags: list[str] = []

    def add(flag: str | None) -> None:
        if flag and flag not in flags:
            flags.append(flag)

    for line in source.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("!") or stripped.startswith("%%bash") or stripped.startswith("%%sh") or \
                stripped.startswith("%system") or stripped.startswith("%sx"):
            add("runs shell commands (!)")
        elif stripped.startswith(("%run", "%load", "%%writefile", "%store", "%env", "%alias", "%%python")):
            add(f"uses the {stripped.split()[0]} magic")
    tree = _parse(source)
    if tree is None:
        return flags
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _module_flag(alias.name, allowed_imports, add, imported=alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                _module_flag(module, allowed_imports, add, imported=f"{module}.{alias.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            add(_CALLS[node.func.id])
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            add(f"touches {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
            base, flag = _ATTRIBUTES[node.attr]
            if base is None or (isinstance(node.value, ast.Name) and node.value.id == base):
                add(flag)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__torch_function__":
            add("overrides torch functions")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for target in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                base = _base_name(target)
                if isinstance(target, ast.Attribute) and base in _LIBRARIES:
                    add(f"replaces a library attribute ({base}.{target.attr})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and _base_name(node.args[0]) in _LIBRARIES:
            add(f"uses {node.func.id}() on {_base_name(node.args[0])}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args \
                and _base_name(node.args[0]) in _LIBRARIES:
            add(f"reaches a library's namespace (vars({_base_name(node.args[0])}))")
        elif isinstance(node, ast.Name) and node.id in ("TorchFunctionMode", "TorchDispatchMode"):
            add("overrides torch functions")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for needle in _STRINGS:
                if needle in node.value:
                    add(f"mentions {needle!r} in a string")
    return flags


#: Names of libraries (as notebooks import them) whose attributes an answer never needs to replace.
_LIBRARIES = {"torch", "F", "nn", "np", "numpy", "math", "builtins", "sys", "os", "attn_course", "IPython",
              "matplotlib", "plt", "tqdm", "importlib"}


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def course_names(source: str, *, allowed_imports: frozenset[str] = frozenset()) -> dict[str, str]:
    """``local name -> what it is`` for every name ``source`` imports from the course's package beyond
    ``allowed_imports`` (``{"ref": "attn_course.attention.attention"}``)."""
    tree = _parse(source)
    found: dict[str, str] = {}
    if tree is None:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attn_course":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full not in allowed_imports:
                    found[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attn_course" and alias.name not in allowed_imports:
                    found[alias.asname or alias.name.split(".")[0]] = alias.name
    return found


def reference_uses(source: str, setup: dict[str, str], *, exercise: str, reference: str) -> list[str]:
    """What of the course's reference code, imported by the set-up cells (``setup``: local name -> full name,
    as :func:`course_names` gives), an exercise cell's ``source`` calls on: a function of the notebook's own
    reference module ``reference`` (``attention_steps``), or that module's version of this very ``exercise``
    (``ref.attention_backward`` in ``attention_backward``). A wrapper around either passes every check while
    the learner wrote nothing: what the "defined in the course's code" verdict cannot see."""
    tree = _parse(source)
    if tree is None:
        return []
    used = used_names(source)
    found = [f"uses `{name}`, the course's reference code ({full})" for name, full in sorted(setup.items())
             if name in used and full.rsplit(".", 1)[0] == reference]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr == exercise and \
                setup.get(node.value.id) == reference:
            flag = f"uses `{node.value.id}.{exercise}`, the course's reference version of this exercise"
            if flag not in found:
                found.append(flag)
    return found


def _module_flag(module: str, allowed: frozenset[str], add, *, imported: str) -> None:
    top = module.split(".")[0]
    if top == "attn_course" or module.startswith("."):
        if imported not in allowed and not any(imported.startswith(a + ".") for a in allowed):
            add(f"imports the course's code ({imported})")
        return
    add(_MODULES.get(top))
