"""The device runner's CUDA-graph eligibility and the OS-visible thread names behind CPU per role."""

from __future__ import annotations

import time

from netgain.server.telemetry.samplers import thread_role


def test_cuda_graph_buckets_and_eligibility() -> None:
    from netgain.server.cudagraphs import bucket
    from netgain.server.device import DeviceRunner
    from netgain.server.handlers import create_handler

    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]
    # Never on the CPU, and never for handlers whose shapes vary from batch to batch.
    assert not DeviceRunner(create_handler("image", {"size": "16"}), "cpu", cuda_graphs=True).cuda_graphs
    text = create_handler("text", {"layers": "1", "d_model": "16", "heads": "2"})
    assert not text.fixed_shapes
    assert create_handler("text", {"pad": "fixed", "layers": "1", "d_model": "16", "heads": "2"}).fixed_shapes


def test_thread_roles_come_from_os_thread_names() -> None:
    """Python threads get OS names, so /proc shows which role used the CPU."""
    import threading

    from netgain.server.telemetry.samplers import read_thread_cpu
    from netgain.server.threadnames import name_os_thread

    seen: dict[str, str] = {}
    stop = threading.Event()

    def work() -> None:
        name_os_thread()
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as fh:
            seen["comm"] = fh.read().strip()
        x = 0
        while not stop.is_set():  # burn a little CPU so the role shows up in the accounting
            x += 1

    t = threading.Thread(target=work, name="netgain-prepost_7")
    t.start()
    deadline = time.monotonic() + 10.0  # polled: on a loaded machine the thread may wait long for a core
    roles = read_thread_cpu()
    while roles.get("prepost", 0.0) <= 0.0 and time.monotonic() < deadline:
        time.sleep(0.01)
        roles = read_thread_cpu()
    stop.set()
    t.join()
    assert seen["comm"] == "ng-prepost_7"
    assert thread_role("ng-prepost_7", 99, 10) == "prepost"
    assert thread_role("ng-device-0", 99, 10) == "device"
    assert thread_role("ng-batcher", 99, 10) == "batcher"
    assert roles.get("prepost", 0.0) > 0.0
