"""The package's structure rules, read from its source: no import cycle, no module
reading another module's private members (docs/worker_layer.md), and functions and classes
of a size a reader can hold in mind.

Both are checked on the AST, nothing is imported. Imports under ``if TYPE_CHECKING:`` and
inside functions are not module imports (they run later, or never) and are left out of the
cycle check.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipelined_vec_env"
TRAINER = PACKAGE.parent / "reference_trainer"

MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 500
# the functions and classes over those sizes today, with their length (lines, docstring left
# out): an entry may only shrink, and goes when its function or class is back under the limit
LONG_FUNCTIONS: dict[str, int] = {}
LONG_CLASSES: dict[str, int] = {}

# private members of other code that the package reads on purpose: the standard library's
# (os._exit in a child process, the fork server's preload list and liveness descriptor) and
# robosuite's, behind the LIBERO wrappers
ALLOWED = {
    "os._exit",
    "forkserver._forkserver",
    "server._forkserver_alive_fd",
    "robot._ref_gripper_joint_pos_indexes",
    "robot._ref_gripper_joint_vel_indexes",
    "self._env._eval_predicate",
    "self._sim_env.env._get_observations",
    "sim.model._model",  # robosuite's MjSim wrappers hold MuJoCo's MjModel / MjData there
    "sim.data._data",
    "sim._render_context_offscreen",  # robosuite's renderer, given its own GL context
}


def _modules() -> dict[str, ast.Module]:
    return {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): ast.parse(p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _defined_private_names(tree: ast.Module) -> set[str]:
    """Private names a module defines itself: methods, functions and ``self._x`` fields."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_")}


def _reaches(tree: ast.Module) -> list[tuple[int, str]]:
    """``x._name`` reads on objects other than ``self``/``cls`` of names the module does
    not define itself."""
    own = _defined_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        text = ast.unparse(node)
        if name in own or text in ALLOWED:
            continue
        found.append((node.lineno, text))
    return found


def _module_imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package modules ``name`` imports at module level (not under TYPE_CHECKING)."""
    package = name if name.endswith("__init__") else name.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    out = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in [node] if not isinstance(node, ast.Try) else node.body:
            if isinstance(sub, ast.ImportFrom):
                if sub.level:
                    base = package.split(".")[: len(package.split(".")) - (sub.level - 1)]
                    target = ".".join(base + ([sub.module] if sub.module else []))
                else:
                    target = sub.module or ""
                candidates = [target] + [f"{target}.{a.name}" for a in sub.names]
                out |= {c for c in candidates if c in known}
                out |= {f"{c}.__init__" for c in candidates if f"{c}.__init__" in known}
            elif isinstance(sub, ast.Import):
                out |= {a.name for a in sub.names if a.name in known}
    out.discard(name)
    return out


def test_no_module_reads_private_members_of_another():
    problems = [
        f"{name}:{line}: {text}"
        for name, tree in _modules().items()
        for line, text in _reaches(tree)
    ]
    assert not problems, "\n".join(problems)


def test_the_reach_check_can_fail():
    tree = ast.parse("def f(envs):\n    return envs._decoupled\n")
    assert _reaches(tree) == [(2, "envs._decoupled")]


def _find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> the modules it imports), depth first."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycle_at_module_level():
    modules = _modules()
    known = set(modules)
    graph = {name: _module_imports(name, tree, known) for name, tree in modules.items()}
    assert (
        "pipelined_vec_env.workers.pool" in graph["pipelined_vec_env.stepping.stage_stepping"]
    )  # read at all
    assert not _find_cycles(graph)


def test_the_cycle_check_can_fail():
    known = {"pkg.a", "pkg.b", "pkg.c"}
    graph = {
        "pkg.a": _module_imports("pkg.a", ast.parse("from .b import x"), known),
        "pkg.b": _module_imports("pkg.b", ast.parse("from . import c"), known),
        "pkg.c": _module_imports("pkg.c", ast.parse("import pkg.a"), known),
    }
    assert _find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    lazy = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x")
    assert _module_imports("pkg.a", lazy, known) == set()


# the layers, bottom to top; a module may import its own layer and those below it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "errors",
            "by_value",
            "infos",
            "batching",
            "env_spaces",
            "reset_arguments",
            "shared_memory",
            "observation_ring",
            "observations",
            "debug_envs",
            "video",
            "moved_modules",
            "stacks",
            "gl_contexts",
            "profiling",
        ),
    ),
    ("workers", ("workers",)),
    ("stepping", ("stepping",)),
    (
        "vector env",
        (
            "vector_env",
            "arguments",
            "calls",
            "registration",
            "sb3",
            "wrappers",
            "libero",
            "testing",
            "torch_observations",
        ),
    ),
    ("tuning", ("tuning", "__init__")),
]


def _layer_of(module: str) -> int:
    """The rank of a package module in ``LAYERS`` (its first name under the package)."""
    head = module.split(".")[1]
    for rank, (_, heads) in enumerate(LAYERS):
        if head in heads:
            return rank
    raise AssertionError(f"{module}: in no layer of tests/test_layering.py's LAYERS")


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} ({LAYERS[_layer_of(name)][0]}) imports {target} ({LAYERS[_layer_of(target)][0]})"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer_of(target) > _layer_of(name)
    ]


def test_no_layer_imports_a_layer_above_it():
    modules = _modules()
    known = set(modules)
    graph = {name: _module_imports(name, tree, known) for name, tree in modules.items()}
    assert not _upward_imports(graph), "\n".join(_upward_imports(graph))


def test_the_layer_check_can_fail():
    graph = {
        "pipelined_vec_env.workers.pool": {"pipelined_vec_env.stepping.stages"},
        "pipelined_vec_env.stepping.stages": {"pipelined_vec_env.workers.pool"},
    }
    assert _upward_imports(graph) == [
        "pipelined_vec_env.workers.pool (workers) imports pipelined_vec_env.stepping.stages"
        " (stepping)"
    ]


def _sizes(module: str, tree: ast.Module) -> dict[str, tuple[str, int]]:
    """Every function and class of ``tree``, nested ones too: qualified name -> (``"def"``
    or ``"class"``, lines from its ``def``/``class`` line to its last, less its own
    docstring: the reference beside the code, not code to hold in mind)."""
    sizes = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                name = f"{prefix}.{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if ast.get_docstring(child, clean=False) is not None:
                    doc = child.body[0]
                    lines -= doc.end_lineno - doc.lineno + 1
                sizes[name] = (kind, lines)
                visit(child, name)
            else:
                visit(child, prefix)

    visit(tree, module.removesuffix(".__init__"))
    return sizes


def _too_long(
    sizes: dict[str, tuple[str, int]], kind: str, limit: int, allowed: dict[str, int]
) -> list[str]:
    """The ``kind`` definitions over ``limit`` lines, less those ``allowed`` at their length
    or above it."""
    return [
        f"{name}: {lines} lines (limit {limit}"
        + (f", allowed {allowed[name]})" if name in allowed else ")")
        for name, (k, lines) in sorted(sizes.items())
        if k == kind and lines > limit and lines > allowed.get(name, limit)
    ]


def _all_sizes() -> dict[str, tuple[str, int]]:
    sizes = {}
    for root in (PACKAGE, TRAINER):
        for path in sorted(root.rglob("*.py")):
            module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            sizes |= _sizes(module, ast.parse(path.read_text()))
    return sizes


def test_no_function_over_max_lines():
    sizes = _all_sizes()
    assert "reference_trainer.train.train" in sizes  # the trainer is read too
    problems = _too_long(sizes, "def", MAX_FUNCTION_LINES, LONG_FUNCTIONS)
    assert not problems, "split these functions into named steps:\n" + "\n".join(problems)


def test_no_class_over_max_lines():
    problems = _too_long(_all_sizes(), "class", MAX_CLASS_LINES, LONG_CLASSES)
    assert not problems, "move a cohesive part of these classes out:\n" + "\n".join(problems)


def test_the_size_checks_can_fail():
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    tree = ast.parse(f"class A:\n    def f(self):\n        def g():\n            pass\n{body}\n")
    sizes = _sizes("pkg.m", tree)
    assert sizes == {"pkg.m.A": ("class", 7), "pkg.m.A.f": ("def", 3), "pkg.m.A.f.g": ("def", 2)}
    assert _too_long(sizes, "def", 2, {}) == ["pkg.m.A.f: 3 lines (limit 2)"]
    assert _too_long(sizes, "def", 2, {"pkg.m.A.f": 3}) == []
    assert _too_long(sizes, "def", 2, {"pkg.m.A.f": 2}) == [
        "pkg.m.A.f: 3 lines (limit 2, allowed 2)"
    ]
    assert _too_long(sizes, "class", 6, {}) == ["pkg.m.A: 7 lines (limit 6)"]
    documented = ast.parse('def f():\n    """One.\n\n    Two.\n    """\n    return 1\n')
    assert _sizes("pkg.m", documented) == {"pkg.m.f": ("def", 2)}
