"""Imports flow one way: ``rlm`` -> ``rlmm``, ``rsm``, which never import each other; and ``rlm`` uses only
``rsm``'s public modules.

Walks every module's imports (``ast``: module level and inside functions alike). ``rlm`` reaches the storage
manager through its API and read interface (``rsm.api``, ``rsm.manager``, ``rsm.errors``, ``rsm.throttle``,
``rsm.verify``) and Kafka's on-disk format (``rsm.log.*``: the copier and staging read local segments), never the
remote object format (``rsm.format.*``) or the stores (``rsm.store.*``).

The read model is one package, ``rlm/tier/``: the chain, the reader, the rlmm-to-rsm adapter and the tier view.
The rule checked: outside ``rlm/tier/``, the shipped code and the scripts import it only as ``rlm.tier`` (its
``__all__``), never one of its modules, so no other home for the chain or the reader can hide behind a shim; and
outside it nothing works out the leader epoch of an offset from a segment's epoch list (no indexing, no loop, no
unpacking of ``segment_leader_epochs``: that is ``RemoteLogSegmentMetadata.epoch_at`` or the tier's
``PartitionTier.epoch_of``; printing the list whole is fine). ``rlm.tier`` sits below its readers, and the Spark
source never imports the Kafka listener (``rlm.listener``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
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


# ---------------------------------------------------------------------------------------------- the read model
TIER = ROOT / "rlm" / "tier"
TIER_MODULES = tuple(f"rlm.tier.{p.stem}" for p in sorted(TIER.glob("*.py")) if p.stem != "__init__")


def _outside_tier(*packages: str) -> list[Path]:
    return [p for package in packages for p in _modules(package) if TIER not in p.parents]


def test_the_read_model_is_one_package_imported_whole() -> None:
    """Outside ``rlm/tier/`` (the shipped packages, the benchmarks and scripts; tests may patch a module of it)
    ``rlm.tier``'s modules are never imported, only ``rlm.tier`` itself."""
    assert {"rlm.tier.chain", "rlm.tier.reader", "rlm.tier.segments", "rlm.tier.view"} <= set(TIER_MODULES)
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
           for path in _outside_tier("rlm", "rsm", "rlmm", "bench", "scripts", "devtools")
           for line, name in _imports(path) if any(_under(name, m) for m in TIER_MODULES)]
    assert bad == []


def _epoch_reads(path: Path) -> Iterator[int]:
    """Lines where ``path`` works with the pairs of a ``segment_leader_epochs``: anything but the iterable of a
    comprehension over whole entries (``[list(e) for e in md.segment_leader_epochs]``: printing them)."""
    tree = ast.parse(path.read_text(), str(path))
    whole = {id(gen.iter) for node in ast.walk(tree) if isinstance(node, ast.comprehension)
             for gen in [node] if isinstance(gen.target, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "segment_leader_epochs" \
                and isinstance(node.ctx, ast.Load) and id(node) not in whole:
            yield node.lineno


def test_only_the_read_model_computes_epochs_of_offsets() -> None:
    """The leader epoch of an offset is ``RemoteLogSegmentMetadata.epoch_at`` (``rlmm/api.py``), of the chain
    segment that ``rlm.tier`` picks; ``rlm`` outside ``rlm/tier/`` never reads it out of the epoch pairs itself."""
    assert list(_epoch_reads(TIER / "view.py")) == [] and list(_epoch_reads(TIER / "segments.py")) != []  # it sees
    bad = [f"{path.relative_to(ROOT)}:{line}" for path in _outside_tier("rlm") for line in _epoch_reads(path)]
    assert bad == []


def test_the_read_model_sits_below_its_readers() -> None:
    """``rlm.tier`` uses ``rlmm``, ``rsm``'s API and ``rlm``'s errors and metrics: never the sidecar, its tasks,
    the CLI, Spark or the listener that read through it."""
    allowed = ("rlm.tier", "rlm.errors", "rlm.metrics")
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {name}" for path in sorted(TIER.glob("*.py"))
           for line, name in _imports(path)
           if _under(name, "rlm") and name != "rlm" and not any(_under(name, a) for a in allowed)]
    assert bad == []


def test_every_reader_reads_through_the_tier() -> None:
    """The CLI, Spark batch and stream, and the Kafka listener all import ``rlm.tier``."""
    readers = ["rlm/cli/context.py", "rlm/spark/planning.py", "rlm/spark/executor.py", "rlm/spark/stream.py",
               "rlm/listener/tier/context.py", "rlm/listener/tier/fetch.py",
               "rlm/listener/tier/offsets.py"]
    assert [r for r in readers if "rlm.tier" not in {name for _, name in _imports(ROOT / r)}] == []


def test_spark_never_imports_the_listener() -> None:
    """The Spark source reads the tier through ``rlm.tier``; the Kafka-protocol listener is not its business."""
    assert _violations("rlm/spark", ("rlm.listener",)) == []


def test_the_listener_never_imports_the_sidecar() -> None:
    """The Kafka listener builds its metadata manager with ``rlm.rlmm_config.make_rlmm``, not through the
    sidecar's wiring (which would load every task to get it)."""
    assert _violations("rlm/listener", ("rlm.sidecar",)) == []


def test_the_listener_protocol_layer_is_only_protocol() -> None:
    """``rlm/listener/protocol/`` (api keys, framing, codecs) knows nothing of sockets, routing, ACLs or the tier."""
    bad = [v for v in _violations("rlm/listener/protocol", ("rlm",))
           if not v.split(": imports ")[1].startswith("rlm.listener.protocol")]
    assert _modules("rlm/listener/protocol") and bad == []


# ------------------------------------------------------------------------------------------------------- the tests
def _is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def _is_conftest(name: str) -> bool:
    return "conftest" in name.split(".")


def _imports_under(paths: list[Path], wanted: Callable[[str], bool],
                   root: Path = ROOT) -> Iterator[tuple[Path, int, str]]:
    """(path, line, imported module) of every import in ``paths`` of a module ``wanted`` says yes to (``from a
    import b``: ``a`` or ``a.b``); relative imports resolved against the importing module's package (its path under
    ``root``)."""
    for path in paths:
        package = path.relative_to(root).with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = list(package[:len(package) - node.level + 1]) if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                if wanted(name):
                    yield path, node.lineno, name
                    break


def test_the_test_walk_sees_imports_of_test_modules_and_conftests(tmp_path: Path) -> None:
    """Each way of naming a test module or a conftest is seen: absolute, relative, ``from package import module``;
    a helper module whose name merely contains ``test_`` (``tests.support.latest_x``) is neither."""
    (tmp_path / "tests" / "rlm").mkdir(parents=True)
    probe = tmp_path / "tests" / "rlm" / "probe.py"
    probe.write_text("import tests.rlm.test_a\nfrom tests.rlm.test_b import x\nfrom .test_c import y\n"
                     "from .listener import test_d\nfrom ..support.sidecar import latest_remote\n"
                     "from tests.support.latest_x import z\nfrom tests.rsm.conftest import new_bucket\n"
                     "from .conftest import w\nfrom . import conftest\n")
    assert [(line, name) for _, line, name in _imports_under([probe], _is_test_module, tmp_path)] == [
        (1, "tests.rlm.test_a"), (2, "tests.rlm.test_b"), (3, "tests.rlm.test_c"), (4, "tests.rlm.listener.test_d")]
    assert [(line, name) for _, line, name in _imports_under([probe], _is_conftest, tmp_path)] == [
        (7, "tests.rsm.conftest"), (8, "tests.rlm.conftest"), (9, "tests.rlm.conftest")]


def test_no_test_module_imports_another() -> None:
    """What tests share lives in ``tests/support/``; no module under ``tests/`` imports a ``test_*`` module: a test
    module's helpers are its own to change, and one module's tests never break because another's were edited."""
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
           for path, line, name in _imports_under(_modules("tests"), _is_test_module)]
    assert bad == []


def test_no_module_imports_a_conftest() -> None:
    """A ``conftest.py`` holds its package's fixtures, for pytest to load: nothing imports it (pytest's advice: under
    ``--import-mode=importlib`` a conftest imported by name is a second module beside the one pytest loaded)."""
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
           for path, line, name in _imports_under(_modules("tests"), _is_conftest)]
    assert bad == []
