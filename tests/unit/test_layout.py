"""The package's layout holds: the product never loads the tooling, and no two product modules import each other
(issue 11). Read from the source with ``ast``, so every import counts, also one inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "applier"
TOOLING = "applier.devtools"
# The one door from the product to the tooling: `applier demo` runs the demo (the README's first command).
ALLOWED_TOOLING_IMPORTS = {("applier.cli", "cmd_demo")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    """(imported applier module, enclosing function or '') for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not func else func
            if isinstance(child, ast.Import):
                out.extend((a.name, f) for a in child.names if a.name.startswith("applier"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod.startswith("applier"):
                    for a in child.names:  # `from applier.x import y` may name a submodule
                        sub = f"{mod}.{a.name}"
                        out.append((sub if sub in known else mod, f))
            visit(child, f)

    visit(tree, "")
    return out


def graph() -> dict[str, set[str]]:
    mods = all_modules()
    known = set(mods)
    g: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for mod, _func in imports_of(name, path, known):
            while mod not in known and "." in mod:
                mod = mod.rsplit(".", 1)[0]
            if mod != name and mod in known:
                deps.add(mod)
        g[name] = deps
    return g


def test_the_product_never_imports_the_tooling() -> None:
    mods = all_modules()
    known = set(mods)
    bad = []
    for name, path in mods.items():
        if name == TOOLING or name.startswith(TOOLING + "."):
            continue
        for mod, func in imports_of(name, path, known):
            if (mod == TOOLING or mod.startswith(TOOLING + ".")) and (name, func) not in ALLOWED_TOOLING_IMPORTS:
                bad.append(f"{name} ({func or 'module level'}) imports {mod}")
    assert not bad, "the product must not load the tooling:\n" + "\n".join(bad)


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
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

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_of_the_product_is_installed() -> None:
    """pyproject.toml lists the packages by name: one left out is missing from a normal (non-editable) install,
    which the editable checkout the tests run in cannot notice."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert on_disk - listed == set()


def test_tests_share_helper_modules_not_each_other_or_conftest() -> None:
    """A test module imports shared helpers from a helper module (tests/*/helpers.py and the like), never from
    another test module or a conftest: those import chains made tests depend on each other's internals."""
    tests = PACKAGE.parent / "tests"
    bad = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
                last = node.module.rsplit(".", 1)[-1]
                if last.startswith("test_") or last == "conftest":
                    bad.append(f"{path.relative_to(tests.parent)} imports {node.module}")
    assert not bad, "\n".join(bad)
