"""The layering, read from the source with ``ast`` (function-local imports included, since they hide cycles):
no import cycle between modules of ``passes/``, and ``runtime/`` imports nothing from ``tvm_interop.passes`` or
the rest of ``tvm_interop`` (a deployed model needs ``tvm_interop.runtime`` and TVM's runtime only). The folders
``passes/`` and ``runtime/`` are the packages ``tvm_interop.passes`` and ``tvm_interop.runtime``; nothing in
the tree may import them by their folder names."""
from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules(package: str) -> dict[str, str]:
    """dotted module name (as installed: ``passes/x.py`` is ``tvm_interop.passes.x``) -> file path, for every .py
    file under the folder ``package``."""
    out = {}
    root = os.path.join(REPO, package)
    prefix = "" if package == "tvm_interop" else "tvm_interop."
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                rel = prefix + os.path.relpath(os.path.join(dirpath, f), REPO)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def _imports(name: str, path: str, known: set[str]) -> set[str]:
    """The modules (of ``known``) that module ``name`` imports anywhere in its body."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_pkg = path.endswith("__init__.py")
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()

    def add(mod: str) -> None:
        while mod and mod not in known:  # `from passes.x import f` -> passes.x; a package -> its __init__
            mod = mod.rpartition(".")[0]
        if mod and mod != name:
            found.add(mod)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(parent + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod in known or any(k.startswith(mod + ".") for k in known):
                for a in node.names:  # `from . import registry` imports the module passes.x.registry
                    sub = f"{mod}.{a.name}"
                    add(sub if sub in known else mod)
            else:
                add(mod)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_graph(folder: str) -> dict[str, set[str]]:
    mods = _modules(folder)
    package = f"tvm_interop.{folder}"
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        # a package's __init__ re-exporting its submodules is not a dependency of those submodules on it
        deps = _imports(name, path, known)
        graph[name] = {d for d in deps if not (name.startswith(d + ".") and d != package)} - {package}
    return graph


def test_no_import_cycle_inside_passes():
    cycles = _cycles(_package_graph("passes"))
    assert not cycles, "import cycles in passes/: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_runtime_imports_nothing_above_it():
    mods = _modules("runtime")
    bad = []
    for name, path in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{name} imports {n}" for n in names
                    if n.split(".")[0] in ("passes", "runtime")
                    or (n.startswith("tvm_interop") and not n.startswith("tvm_interop.runtime"))]
    assert not bad, bad


def test_nothing_imports_the_folders_by_their_own_names():
    """``passes`` / ``runtime`` are not installed as top-level packages: an import of either would work from a
    checkout and fail for a user (or load a second copy of every module beside ``tvm_interop.passes``)."""
    bad = []
    for folder in ("tvm_interop", "passes", "runtime", "scripts", "tests"):
        for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                for node in ast.walk(tree):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                    bad += [f"{os.path.relpath(path, REPO)}:{node.lineno} imports {n}" for n in names
                            if n.split(".")[0] in ("passes", "runtime")]
    assert not bad, bad


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
