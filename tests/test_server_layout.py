"""How ``netgain serve`` lays out its processes: --workers and --pre-processes, resolved."""

from __future__ import annotations

import pytest

from netgain.server.config import ServeConfig, core_sets


def test_workers_auto_gives_the_cores_to_the_stage_that_needs_them() -> None:
    """On a GPU every spare core pre-processes; on the CPU the forward needs them, so two frontends."""
    auto = ServeConfig()
    assert [auto.resolved_workers(c, "cuda") for c in (2, 4, 12, 64)] == [0, 2, 10, 16]
    assert [auto.resolved_workers(c, "cpu") for c in (2, 4, 12, 64)] == [0, 2, 2, 2]
    assert ServeConfig(workers=5).resolved_workers(12, "cpu") == 5
    assert ServeConfig(profile_dir="p").resolved_workers(12, "cuda") == 0


def test_pre_processes_split_the_cores_by_the_handlers_pre_processing_time() -> None:
    auto = ServeConfig()
    # 10 usable cores: one process each, split by the CPU each side spends per request, the
    # frontends rounded up.
    assert auto.resolved_split(10, "cuda", pre_ms=1.2) == (3, 7)  # image-like: most cores decode
    assert auto.resolved_split(10, "cuda", pre_ms=0.2) == (7, 3)  # text-like: most cores serve gRPC
    assert auto.resolved_split(10, "cuda", pre_ms=100.0) == (1, 9)
    assert auto.resolved_split(10, "cuda", pre_ms=0.0) == (9, 1)
    assert auto.resolved_split(12, "cpu", pre_ms=1.8) == (2, 0)  # on the CPU the forward takes the cores
    assert auto.resolved_split(2, "cuda", pre_ms=1.8) == (0, 0)
    assert ServeConfig(workers=4).resolved_split(10, "cuda", 1.2) == (4, 6)
    assert ServeConfig(workers=4, pre_processes=0).resolved_split(10, "cuda", 1.8) == (4, 0)
    with pytest.raises(ValueError, match="--pre-processes needs frontend processes"):
        ServeConfig(pre_processes=2).resolved_split(2, "cuda", 1.8)
    bad = ServeConfig(workers=0, pre_processes="3")
    with pytest.raises(ValueError, match="--pre-processes needs --workers above 0"):
        bad.validate()
    for pinned_without in (
        ServeConfig(workers=0, pin_pre_processes=True),
        ServeConfig(pre_processes=0, pin_pre_processes=True),
    ):
        with pytest.raises(ValueError, match="--pin-pre-processes needs pre-processing processes"):
            pinned_without.validate()
    ServeConfig(pin_pre_processes=True).validate()  # auto: pins whatever the layout gives
    with pytest.raises(ValueError, match="--pre-processes 'x': use a whole number"):
        ServeConfig(pre_processes="x").validate()


def test_device_cores_keep_the_highest_cores_for_the_device_process() -> None:
    assert core_sets({0, 1, 2, 3}, 0) == ([0, 1, 2, 3], [0, 1, 2, 3])
    assert core_sets({4, 0, 9, 2}, 1) == ([9], [0, 2, 4])
    assert core_sets({0, 1, 2, 3}, 2) == ([2, 3], [0, 1])
    with pytest.raises(ValueError, match="--device-cores 2 leaves no core for the frontends: 2 usable"):
        core_sets({0, 1}, 2)
    # auto: one core alone for a device process whose items are small (text), none for large
    # ones (image pixels), none on the CPU or on a small host.
    auto = ServeConfig()
    auto.validate()
    assert auto.resolved_device_cores(10, "cuda", item_bytes=512) == 1
    assert auto.resolved_device_cores(10, "cuda", item_bytes=150_528) == 0
    assert auto.resolved_device_cores(10, "cpu", item_bytes=512) == 0
    assert auto.resolved_device_cores(4, "cuda", item_bytes=512) == 0
    assert ServeConfig(device_cores=2).resolved_device_cores(10, "cpu", 512) == 2
    # The kept cores leave the split: 10 usable, 1 kept, 9 processes split by the same rule.
    assert auto.resolved_split(10, "cuda", pre_ms=1.2, kept=1) == (3, 6)
    assert ServeConfig(device_cores=4).resolved_workers(12, "cuda") == 7
    with pytest.raises(ValueError, match=r"--device-cores must be 0\.\.256 or auto"):
        ServeConfig(device_cores=-1).validate()
    with pytest.raises(ValueError, match="--device-cores 'x': use a whole number"):
        ServeConfig(device_cores="x").validate()
