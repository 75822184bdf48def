"""GPU inventory: the example inventory files, the per-pair link matrix, clear errors, and NVML detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.placement.gpus import (
    Gpu,
    Inventory,
    InventoryError,
    describe_inventory,
    detect_inventory,
    load_inventory,
    uniform_links,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "inventories"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("name", "totals", "link"),
    [
        ("1x24gb", [24564], None),
        ("2x24gb-pcie", [24576, 24576], "pcie"),
        ("2x141gb-nvlink", [143771, 143771], "nvlink"),
        ("4x80gb-nvlink", [81559] * 4, "nvlink"),
        ("80gb-24gb-mixed", [81920, 24576], "pcie"),
        ("24gb-12gb-mixed", [24576, 12288], "pcie"),
    ],
)
def test_example_inventories_load(name: str, totals: list[int], link: str | None) -> None:
    inv = load_inventory(EXAMPLES / f"{name}.yaml")
    assert [g.total_mib for g in inv.gpus] == totals
    assert [g.index for g in inv.gpus] == list(range(len(totals)))
    assert all(0 < g.free_mib <= g.total_mib for g in inv.gpus)
    assert inv.source == f"file:{name}.yaml"
    for i in range(len(totals)):
        for j in range(len(totals)):
            assert inv.link(i, j) == ("self" if i == j else link)


def test_per_pair_matrix_and_grouping_queries() -> None:
    inv = load_inventory(EXAMPLES / "4x80gb-two-nvlink-pairs.yaml")
    assert inv.link(0, 1) == "nvlink" and inv.link(2, 3) == "nvlink"
    assert inv.link(1, 2) == "pcie" and inv.link(3, 0) == "pcie"
    assert inv.all_linked((0, 1), "nvlink") and inv.all_linked((2, 3), "nvlink")
    assert not inv.all_linked((0, 1, 2), "nvlink")
    assert "nvlink, pcie" in describe_inventory(inv)


def test_defaults_free_is_total_and_interconnect_is_pcie(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "gpus:\n  - {total_mib: 1000}\n  - {total_mib: 2000, index: 5}\n"))
    assert inv.gpus == (Gpu(0, "GPU", 1000, 1000), Gpu(5, "GPU", 2000, 2000))
    assert inv.link(0, 1) == "pcie"
    assert inv.position(5) == 1
    with pytest.raises(KeyError, match="GPU 3 is not in the inventory"):
        inv.position(3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus:\n  - {name: X}\n", "'gpus.0.total_mib': Field required"),
        ("gpus:\n  - {total_mib: 100, free_mib: 200}\n", "free_mib (200) exceeds total_mib (100)"),
        ("gpus:\n  - {total_mib: 100, vram: 3}\n", "'gpus.0.vram': Extra inputs are not permitted"),
        ("gpus:\n  - {total_mib: 100}\ninterconnect: infiniband\n", "'interconnect'"),
        ("- {total_mib: 100}\n", "must be a mapping with a 'gpus' list"),
        ("gpus: [{total_mib: 1}, {total_mib: 1}]\nlinks: [[self, nvlink], [pcie, self]]\n",
         "links[0][1] (nvlink) differs from links[1][0] (pcie)"),
        ("gpus: [{total_mib: 1}, {total_mib: 1}]\nlinks: [[self, nvlink]]\n", "must be a 2x2 matrix"),
        ("gpus: [{total_mib: 1}, {total_mib: 1}]\nlinks: [[nvlink, nvlink], [nvlink, self]]\n",
         "'self' belongs exactly on the diagonal"),
        ("gpus: [{total_mib: 1, index: 0}, {total_mib: 1, index: 0}]\n", "two GPUs share an index"),
        ("gpus: [\n", "line 2, column 1: not valid YAML"),
    ],
)
def test_bad_files_are_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InventoryError) as e:
        load_inventory(write(tmp_path, text))
    assert message in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="inventory file not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_inventory_checks_its_matrix() -> None:
    gpus = (Gpu(0, "a", 10, 10), Gpu(1, "b", 10, 10))
    with pytest.raises(ValueError, match="use one of self, nvlink, pcie"):
        Inventory(gpus, (("self", "p2p"), ("p2p", "self")), "test")
    assert Inventory(gpus, uniform_links(2, "nvlink"), "test").all_linked((0, 1), "nvlink")


def test_detect_inventory_never_raises_and_explains_an_empty_result() -> None:
    inv = detect_inventory()
    if inv.gpus:
        assert inv.source == "nvml"
        assert all(g.total_mib > 0 and g.uuid for g in inv.gpus)
        assert len(inv.links) == len(inv.gpus)
    else:
        assert inv.source in ("none", "nvml") and inv.note
        assert "planning for the CPU" in describe_inventory(inv)
    assert inv.host_mem_mib is None or inv.host_mem_mib > 0
