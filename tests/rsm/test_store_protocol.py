"""The store protocol declares what the storage manager uses of a store: the required members in
:class:`~rsm.store.base.Store`, the optional ones each in its capability protocol, with the stores' signatures."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from rsm.store.base import OPTIONAL_MEMBERS, Store
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store

MANAGER = Path(__file__).resolve().parents[2] / "rsm" / "manager.py"


def _protocol_methods(proto: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(v) for n, v in vars(proto).items() if not n.startswith("_") and callable(v)}


def test_every_member_the_manager_looks_up_is_declared_optional() -> None:
    looked_up = {node.args[1].value for node in ast.walk(ast.parse(MANAGER.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                 and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                 and "store" in ast.unparse(node.args[0])}
    assert looked_up == set(OPTIONAL_MEMBERS)


@pytest.mark.parametrize("store", [FileSystemStore, S3Store])
def test_a_stores_methods_are_declared_with_its_signatures(store: type) -> None:
    declared = _protocol_methods(Store)
    for proto in set(OPTIONAL_MEMBERS.values()):
        declared.update(_protocol_methods(proto))
    methods = {n: inspect.signature(v) for n, v in inspect.getmembers(store)
               if not n.startswith("_") and callable(v)}
    assert set(methods) - set(declared) == set()
    for name, sig in methods.items():
        assert list(sig.parameters) == list(declared[name].parameters), name


@pytest.mark.parametrize("store", [FileSystemStore, S3Store])
def test_a_store_has_each_capability_whole_or_not_at_all(store: type) -> None:
    """Required members all there; an optional capability's members all there or none (``key_prefix`` is an
    instance attribute of S3Store: looked for in its constructor)."""
    source = inspect.getsource(store)
    has = {name: hasattr(store, name) or f"self.{name} =" in source for name in OPTIONAL_MEMBERS}
    assert all(hasattr(store, n) for n in _protocol_methods(Store))
    for proto in set(OPTIONAL_MEMBERS.values()):
        members = [n for n, p in OPTIONAL_MEMBERS.items() if p is proto]
        assert len({has[n] for n in members}) == 1, (proto.__name__, {n: has[n] for n in members})
