"""The layers' import rules (docs/architecture.md: Layers), checked on the source, not by importing it.

A rule broken here is a design change: move the code to the layer that owns it, or change the rule
and the document together.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("duplex", "streaming", "models", "server", "train", "bench", "deploy")
# What each first-party package may import besides itself (third-party and stdlib are not checked).
MAY_IMPORT: dict[str, set[str]] = {
    "streaming": set(),
    "models": {"streaming"},
    "server": {"models", "streaming"},
    "train": {"models", "streaming"},
    "deploy": {"server", "models", "streaming"},
    "bench": {"server", "models", "streaming", "train"},
    "duplex": {"server", "train", "deploy", "models", "streaming"},
}


# Inside models/: the voices are siblings that never import each other; what they share (the turn-taking parts,
# the speech parts, the base protocols, threads, ...) sits below them and imports none; only the registry, which
# maps names to loaders, imports a voice. models.turns, the lowest, imports no speech part either.
VOICES = ("models.interaction", "models.cascade", "models.moshi")
ABOVE_VOICES = ("models.registry",)
BELOW_SPEECH = ("models.turns",)


def _within(module: str, packages: tuple[str, ...]) -> str | None:
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def _modules() -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _imports(module: str, path: Path, top_level_only: bool) -> Iterator[tuple[str, int]]:
    """First-party modules imported by `module`, with line numbers; `top_level_only` skips imports inside
    functions (those run late, so they cannot make a cycle at import time)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` / `try:` at module level count too
        nodes = [n for stmt in tree.body for n in ast.walk(stmt)
                 if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import submodule` names the submodule (the caller resolves which it is);
            # `from module import name` names the module.
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def test_each_layer_imports_only_what_it_may() -> None:
    wrong = []
    for module, path in _modules():
        own = module.split(".")[0]
        for target, line in _imports(module, path, top_level_only=False):
            other = target.split(".")[0]
            if other in PACKAGES and other != own and other not in MAY_IMPORT[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({own} may import "
                             f"{sorted(MAY_IMPORT[own]) or 'no other layer'})")
    assert not wrong, "\n".join(wrong)


def test_models_voices_are_siblings_over_shared_parts() -> None:
    wrong = []
    for module, path in _modules():
        if not module.startswith("models.") or _within(module, ABOVE_VOICES):
            continue
        own = _within(module, VOICES)
        for target, line in _imports(module, path, top_level_only=False):
            other = _within(target, VOICES)
            if other is not None and other != own:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} (a voice imports no other voice, "
                             "and what they share imports none)")
            if _within(module, BELOW_SPEECH) and _within(target, ("models.speech",)):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} (models.turns sits below the "
                             "speech parts)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    """Imports inside functions count too: a cycle through one still ties the two modules' designs together
    (and fails once the call runs during the other's import)."""
    names = dict(_modules())
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        deps = set()
        for target, _ in _imports(module, path, top_level_only=False):
            while target and target not in names:  # `from a.b import name`: the module is a.b
                target = target.rpartition(".")[0]
            if target and target != module:
                deps.add(target)
        graph[module] = deps
    # Depth-first search with colours; report the first cycle found as a path.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*stack[stack.index(d):], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


# A date (2026-12-07) or an issue number in a module is history, not a reason: figures live in docs/results/
# (one file per measurement) and history in git. Test files are checked as well as the packages.
_RESULTS_LINK = re.compile(r"docs/results/\S+")  # a pointer to a results file names its date: that is fine
_HISTORY = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b[Ii]ssues? #?\d+\b|\(#\d+\)")


def test_no_module_cites_dates_or_issue_numbers() -> None:
    files = [path for _, path in _modules()] + sorted((ROOT / "tests").rglob("*.py"))
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
             for path in files for n, line in enumerate(path.read_text().splitlines(), 1)
             if _HISTORY.search(_RESULTS_LINK.sub("", line)) and path != Path(__file__).resolve()]
    assert not found, "dates or issue numbers in code (move the figure to docs/results/):\n" + "\n".join(found)
