"""Imports flow one way: ``rlm`` -> ``rlmm``, ``rsm``, which never import each other; and ``rlm`` uses only
``rsm``'s public modules.

Walks every module's imports (``ast``: module level and inside functions alike). ``rlm`` reaches the storage
manager through its API and read interface (``rsm.api``, ``rsm.manager``, ``rsm.errors``, ``rsm.throttle``,
``rsm.verify``) and Kafka's on-disk format (``rsm.log.*``: the copier and staging read local segments), never the
remote object format (``rsm.format.*``) or the stores (``rsm.store.*``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RSM_PRIVATE = ("rsm.format", "rsm.store")


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every absolute import in ``path`` (``from a import b``: both ``a`` and
    ``a.b``, since ``b`` may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: imports {name}" for path in _modules(package)
            for line, name in _imports(path) if any(_under(name, f) for f in forbidden)]


def test_the_walk_sees_imports() -> None:
    """The check below is not vacuous: rlm's modules are found and their rsm imports seen."""
    assert len(_modules("rlm")) > 20
    seen = {name for path in _modules("rlm") for _, name in _imports(path)}
    assert "rsm.api" in seen and "rlmm.api" in seen


def test_rlm_uses_only_rsm_public_modules() -> None:
    assert _violations("rlm", RSM_PRIVATE) == []


@pytest.mark.parametrize("package", ["rsm", "rlmm"])
def test_rsm_and_rlmm_never_import_rlm(package: str) -> None:
    assert _violations(package, ("rlm",)) == []


def test_the_storage_contract_depends_on_no_implementation() -> None:
    """``rsm/api.py`` is the contract: it may use Kafka's on-disk format (``rsm.log``), never the modules that
    implement it (``rsm.verify``'s report type lives in the API)."""
    api = ROOT / "rsm" / "api.py"
    assert [name for _, name in _imports(api) if _under(name, "rsm") and not _under(name, "rsm.log")] == []


@pytest.mark.parametrize(("package", "other"), [("rsm", "rlmm"), ("rlmm", "rsm")])
def test_rsm_and_rlmm_never_import_each_other(package: str, other: str) -> None:
    """The storage manager and the metadata manager are independent (as Kafka's RSM and RLMM): ``rlm`` joins them."""
    assert _violations(package, (other,)) == []


def test_only_the_wiring_and_the_commands_import_the_tasks() -> None:
    """``rlm.tasks`` is the top of ``rlm``: what the tasks share (``rlm.state``, ``rlm.known`` ...) sits below them."""
    assert [v for v in _violations("rlm", ("rlm.tasks",))
            if not v.startswith(("rlm/tasks/", "rlm/sidecar.py:", "rlm/cli/"))] == []
