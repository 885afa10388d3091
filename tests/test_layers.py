"""The package's layering, read from the source with `ast`: no import cycles, no import of a
layer above, a torch-free core, a compiler that never sees the runner, entry points that stay
out of engine internals, and a short top level.

Imports count wherever they sit (module level and inside functions); blocks under
`if TYPE_CHECKING:` never run and are skipped.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "compiled_llm"

# From the top; a module may import its own layer or any layer below it (a larger index).
LAYERS = [
    ("compiled_llm.entrypoints", "compiled_llm.inputs", "compiled_llm.outputs"),
    ("compiled_llm.engine",),
    ("compiled_llm.output",),
    ("compiled_llm.executor",),
    ("compiled_llm.worker",),
    ("compiled_llm.sample",),
    ("compiled_llm.compile",),
    ("compiled_llm.distributed",),
    ("compiled_llm.quantization", "compiled_llm.lora"),
    ("compiled_llm.passes",),
    ("compiled_llm.models",),
    ("compiled_llm.attention", "compiled_llm.moe", "compiled_llm.gemm"),
    ("compiled_llm.core",),
    ("compiled_llm.config", "compiled_llm.optimization", "compiled_llm.compat",
     "compiled_llm.bytecode_cache",
     "compiled_llm.sampling_params", "compiled_llm.sample.structured_params",
     "compiled_llm.lora.request", "compiled_llm.lora.config",
     PKG),
]
CORE_THIRD_PARTY = {"xxhash"}
ENGINE_INTERNALS = {"runner", "scheduler", "kv", "executor", "model_runner"}
MAX_TOP_LEVEL_MODULES = 10


@dataclass(frozen=True)
class Import:
    """One import statement's target: `imported` is a package module or a third-party name."""

    importer: str
    imported: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}  {self.importer} -> {self.imported}"


def source_roots() -> dict[str, Path]:
    """Package name -> directory, as setuptools maps them (passes/ and models/ included)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / path for name, path in conf["package-dir"].items()}


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, each real file once (symlinked dirs are not walked)."""
    out: dict[str, Path] = {}
    for pkg, base in source_roots().items():
        for dirpath, dirnames, filenames in os.walk(base):  # followlinks=False
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = Path(dirpath).relative_to(base).parts
            for fname in filenames:
                if not fname.endswith(".py"):
                    continue
                stem = () if fname == "__init__.py" else (fname[:-3],)
                out[".".join((pkg, *rel, *stem))] = Path(dirpath) / fname
    return out


MODULES = module_files()


def lazy_public_names() -> dict[str, str]:
    """`compiled_llm.<name>` -> the module its lazy `__getattr__` imports (the _PUBLIC table)."""
    tree = ast.parse(MODULES[PKG].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_PUBLIC":
            return ast.literal_eval(node.value)
    return {}


PUBLIC = lazy_public_names()


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_nodes(tree: ast.AST):
    """Every node that can run: the bodies of `if TYPE_CHECKING:` are left out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def base_package(module: str, level: int) -> str:
    """The package a relative import of `level` dots starts from, inside `module`."""
    is_pkg = MODULES[module].name == "__init__.py"
    parts = module.split(".")
    keep = len(parts) - level + (1 if is_pkg else 0)
    return ".".join(parts[:keep])


def resolve(target: str) -> str:
    """A package module for `target` (its longest known prefix), or a third-party top name."""
    if target != PKG and not target.startswith(PKG + "."):
        return target.split(".")[0]
    while target not in MODULES:
        target = target.rsplit(".", 1)[0]
    return target


def from_targets(module: str, node: ast.ImportFrom) -> list[str]:
    """What `from X import a, b` loads: X.a where that is a module (or a lazy public name)."""
    base = node.module or ""
    if node.level:
        base = ".".join(p for p in (base_package(module, node.level), base) if p)
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in MODULES:
            out.append(sub)
        elif base == PKG and alias.name in PUBLIC:
            out.append(PUBLIC[alias.name])
        else:
            out.append(base)
    return out


def imports_of(module: str) -> list[Import]:
    """Every runtime import in one module, resolved."""
    if module == PKG:  # names its public objects lazily; imports nothing itself
        return []
    path = MODULES[module]
    out = []
    for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = from_targets(module, node)
        else:
            continue
        out += [Import(module, resolve(t), path, node.lineno) for t in targets]
    return list(dict.fromkeys(out))  # `from x import a, b` is one edge


ALL_IMPORTS = [imp for module in sorted(MODULES) for imp in imports_of(module)]
PACKAGE_IMPORTS = [imp for imp in ALL_IMPORTS if imp.imported in MODULES]


def layer_of(module: str) -> int | None:
    """Index into LAYERS (0 is the top) by the longest matching prefix; None if unplaced."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def report(title: str, offenders: list) -> str:
    return f"{title} ({len(offenders)}):\n" + "\n".join(f"  {o}" for o in offenders)


def test_the_scanner_sees_the_mapped_packages_once():
    files = list(MODULES.values())
    assert len(files) == len({f.resolve() for f in files})
    assert {"compiled_llm.models.llama", "compiled_llm.passes.manager",
            "compiled_llm.core.scheduler"} <= set(MODULES)
    assert not any(m.startswith(("models.", "passes.")) for m in MODULES)


def test_the_scanner_finds_cycles_and_skips_type_checking():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["e", "f"]]
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import torch\nelse:\n    import re\n"
                     "def f():\n    import json\n")
    names = {a.name for n in runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"os", "re", "json"}


def test_no_import_cycles():
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in PACKAGE_IMPORTS:
        if imp.imported != imp.importer:
            graph[imp.importer].add(imp.imported)
    cycles = strongly_connected(graph)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {imp}" for imp in PACKAGE_IMPORTS
                  if imp.importer in members and imp.imported in members
                  and imp.importer != imp.imported]
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(f"  {x}" for x in lines)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, report("modules in no layer (add them to LAYERS)", unplaced)


def test_no_module_imports_a_layer_above_its_own():
    upward = [imp for imp in PACKAGE_IMPORTS
              if None not in (layer_of(imp.importer), layer_of(imp.imported))
              and layer_of(imp.imported) < layer_of(imp.importer)]
    assert not upward, report("imports of a layer above", upward)


def test_core_imports_no_third_party_but_xxhash():
    allowed = set(sys.stdlib_module_names) | CORE_THIRD_PARTY | {"__future__"}
    bad = [imp for imp in ALL_IMPORTS
           if layer_of(imp.importer) == layer_of("compiled_llm.core")
           and imp.imported not in MODULES and imp.imported not in allowed]
    assert not bad, report("third-party imports in compiled_llm.core", bad)


def test_core_runs_without_torch():
    code = ("import sys, compiled_llm.core.scheduler, compiled_llm.core.kv_cache_manager\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "'torch'" not in res.stdout, f"importing the scheduler loaded: {res.stdout[:500]}"


def test_compile_never_imports_the_worker():
    bad = [imp for imp in PACKAGE_IMPORTS
           if layer_of(imp.importer) == layer_of("compiled_llm.compile")
           and layer_of(imp.imported) == layer_of("compiled_llm.worker")]
    assert not bad, report("compiled_llm.compile imports of the worker", bad)


def test_entrypoints_stay_out_of_engine_internals():
    found = set()
    for module, path in MODULES.items():
        if layer_of(module) != layer_of("compiled_llm.entrypoints"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_INTERNALS:
                found.add((str(path.relative_to(ROOT)), node.lineno, ast.unparse(node)))
    bad = [f"{rel}:{line}  {expr}" for rel, line, expr in sorted(found)]
    assert not bad, report("entry point reaches into the engine", bad)


def test_top_level_stays_short():
    top = sorted(p.name for p in (ROOT / PKG).glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, report("modules directly in compiled_llm/", top)
