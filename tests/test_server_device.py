"""The device runner: CUDA-graph eligibility, warm-up batch sizes, the CPU weight layout, and the OS-visible
thread names behind CPU per role."""

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
    assert thread_role("ng-metrics", 99, 10) == "telemetry"  # a child's metrics server
    assert roles.get("prepost", 0.0) > 0.0


class _Recording:
    """A device runner's warm-up surface that records the batch sizes it is given to run."""

    def __init__(self, handler: object, is_cuda: bool, cuda_graphs: bool = False) -> None:
        self.handler, self.is_cuda, self.cuda_graphs = handler, is_cuda, cuda_graphs
        self.sizes: list[int] = []

    def prepare(self, batch: object) -> object:
        return batch

    def run(self, batch: object) -> None:
        from netgain.server.device import batch_rows

        self.sizes.append(batch_rows(batch))


def _warm(is_cuda: bool, cuda_graphs: bool = False, max_batch: int = 6, rounds: int = 3) -> list[int]:
    from netgain.server.bootstrap import warm_up
    from netgain.server.config import ServeConfig
    from netgain.server.handlers import create_handler

    handler = create_handler("image", {"size": "16"})
    runner = _Recording(handler, is_cuda, cuda_graphs)
    warm_up(handler, runner, ServeConfig(max_batch_size=max_batch, warmup_batches=rounds))  # type: ignore[arg-type]
    return runner.sizes


def test_warm_up_runs_every_batch_size_once_on_cuda_and_the_ends_on_the_cpu() -> None:
    """A batch size first seen while serving costs a CUDA device a kernel choice (docs/benchmarks.md),
    so its warm-up forms every size the batcher can; the CPU's first round is the ends only."""
    assert _warm(is_cuda=True) == [1, 2, 3, 4, 5, 6, 1, 6, 1, 6]
    assert _warm(is_cuda=False) == [1, 6, 1, 6, 1, 6]
    assert _warm(is_cuda=True, cuda_graphs=True) == [1, 2, 4, 6, 1, 6, 1, 6]  # the graph buckets
    assert _warm(is_cuda=True, rounds=1) == [1, 2, 3, 4, 5, 6]
    assert _warm(is_cuda=True, rounds=0) == []  # --warmup-batches 0 turns warm-up off
    assert _warm(is_cuda=False, max_batch=1) == [1, 1, 1]


def test_a_convolutional_model_is_placed_channels_last_on_the_cpu_with_the_same_outputs() -> None:
    """oneDNN runs batches of convolutions faster with channels-last weights (bench_cpu_layout.py);
    the answers must not change, and a model without convolutions is left as built."""
    import random

    import torch

    from netgain.server.device import DeviceRunner
    from netgain.server.handlers import create_handler

    handler = create_handler("image", {"size": "32"})
    runner = DeviceRunner(handler, "cpu")
    runner.place(handler.build_model())
    convs = [m for m in runner.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not all(c.weight.is_contiguous() for c in convs)  # really moved, not contiguous both ways
    rng = random.Random(0)
    batch = handler.collate([handler.preprocess(handler.example_input(rng)) for _ in range(4)])
    with torch.inference_mode():
        expected = handler.forward(handler.build_model().eval(), batch)
    assert torch.allclose(runner.run(batch).output, expected, rtol=1e-4, atol=1e-5)

    text = create_handler("text", {"layers": "1", "d_model": "16", "heads": "2"})
    plain = DeviceRunner(text, "cpu")
    plain.place(text.build_model())
    assert all(p.is_contiguous() for p in plain.model.parameters())
