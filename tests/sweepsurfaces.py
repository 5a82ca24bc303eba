"""Synthetic servers for the search: a configuration's capacity within the SLO AND the figures the verdict is
read from, from one small model of a batching server (pure; used by tests/unit/sweep/test_search_guided.py and
benchmarks/sweep_guided.py).

A request is decoded on a worker's CPU (`decode_ms`, on at most `cores` cores at once), then batched; the
forward pass of a batch of b takes `fixed_ms + per_item_ms * b` on one device shared by the workers (its
`device_slots` passes run at once: 1 for a GPU, more for a device that waits, like a remote one). A worker
does one batch at a time: decode its requests, then the forward pass. Under an open load just below
capacity a batch of b forms in at most the delay. The p99 is about two batch cycles plus the delay; the
saturation rate is the least of what the workers, the CPU and the device allow, with batches as large as
the arrival rate fills within the delay; a trial is measured at LOAD of it, where a request waits for its
batch to fill (at most the delay) and about half a batch cycle for a worker.

Each configuration's level is then judged by the real verdict (:func:`servinglab.measure.verdict.judge`),
so the search sees what it would see from a real trial: its capacity and its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from servinglab.api import TrialConfig
from servinglab.api.figures import GpuFigures
from servinglab.api.results import LevelResult, ServerSettings
from servinglab.api.verdicts import CpuFigures
from servinglab.measure.verdict import judge
from servinglab.sweep.search import Outcome

#: Trials measure a configuration at this share of its saturation rate.
LOAD = 0.85


@dataclass(frozen=True)
class Server:
    name: str
    decode_ms: float
    fixed_ms: float
    per_item_ms: float
    cores: int
    device_slots: int
    slo_ms: float = 200.0
    gpu: bool = True

    def formed_batch(self, config: TrialConfig, rate: float) -> float:
        return max(1.0, min(float(config.batch_size), rate * config.max_batch_delay_ms / 1000))

    def capacity(self, config: TrialConfig) -> tuple[float, float]:
        """(capacity rps, formed batch) at the fixed point of rate -> batch -> rate."""
        rate = 1.0
        for _ in range(60):
            batch = self.formed_batch(config, rate)
            forward = self.fixed_ms + self.per_item_ms * batch
            cycle = batch * self.decode_ms + forward
            workers = config.workers * batch / cycle * 1000
            cpu = self.cores / self.decode_ms * 1000 if self.decode_ms else float("inf")
            device = self.device_slots * batch / forward * 1000
            rate = 0.5 * rate + 0.5 * min(workers, cpu, device)
        return rate, self.formed_batch(config, rate)

    def level(self, config: TrialConfig) -> LevelResult:
        saturation, batch = self.capacity(config)
        rate = LOAD * saturation
        forward = self.fixed_ms + self.per_item_ms * batch
        device_busy = min(rate / batch * forward / 1000 / self.device_slots, 0.95)
        # a worker's forward pass includes its wait for the shared device (M/D/1's mean wait)
        forward_seen = forward * (1 + device_busy / (2 * (1 - device_busy)))
        decode = batch * self.decode_ms
        cycle = decode + forward_seen
        # a request waits for its batch to fill (at most the delay), then about half a cycle for a worker
        queue = min(config.max_batch_delay_ms, 1000 * batch / rate) + 0.5 * cycle
        p99 = 2 * cycle + queue
        cpu_wanted = rate * self.decode_ms / 1000 + (rate / batch * forward / 1000 if not self.gpu else 0.0)
        return LevelResult.model_validate({
            "rateRps": round(rate, 3), "throughputRps": round(rate, 3), "requests": int(rate * 10), "errors": 0,
            "windowSeconds": 10.0, "latencyMs": {"mean": p99 / 2, "p99": p99},
            "server": {"queueMsMean": queue, "serverLatencyMsMean": p99 / 2 - 1, "preprocessMsPerBatch": decode,
                       "inferenceMsPerBatch": forward_seen, "postprocessMsPerBatch": 0.1, "meanBatchSize": batch,
                       "batches": rate / batch * 10, "serverRequests": rate * 10},
            "gpu": GpuFigures(utilization_avg_percent=device_busy * 100).model_dump() if self.gpu else None,
            "cpu": CpuFigures(cores_busy=min(cpu_wanted, self.cores), cores_wanted=cpu_wanted,
                              cores=self.cores).model_dump() if not self.gpu else None,
        })  # fmt: skip

    def outcome(self, config: TrialConfig) -> Outcome:
        level = self.level(config)
        p99 = level.latency_ms.p99 or 0.0
        settings = ServerSettings(batch_size=config.batch_size, max_batch_delay_ms=config.max_batch_delay_ms,
                                  workers=config.workers)  # fmt: skip
        verdict = judge(level, settings)
        return Outcome(config, level.throughput_rps if p99 <= self.slo_ms else None, verdict=verdict)


SERVERS = (
    # ResNet-50-like on a GPU with the decode on each worker's CPU (16 cores): workers first, then batch
    Server("cpu decode, GPU model", decode_ms=6.0, fixed_ms=4.0, per_item_ms=0.6, cores=16, device_slots=1),
    # a compute-heavy model on a GPU, decode cheap: the batch (and the delay that fills it) matter
    Server("GPU compute", decode_ms=0.3, fixed_ms=12.0, per_item_ms=0.5, cores=16, device_slots=1),
    # the model waits on a remote device with room: more workers overlap the waits
    Server("remote device", decode_ms=0.5, fixed_ms=30.0, per_item_ms=1.0, cores=16, device_slots=8),
    # the CPU runs everything (4 cores): decode and model compete for them
    Server("all on 4 CPU cores", decode_ms=2.0, fixed_ms=3.0, per_item_ms=4.0, cores=4, device_slots=4, gpu=False),
)
