"""What the load generators and their coordinator say to each other: an explicit JSON codec.

Each message is a JSON object with a `kind`; every value that travels has its own encoder and a
decoder that checks it field by field and refuses (MessageError, naming the message and the field)
anything else: an unknown kind, a missing or mistyped field, a non-finite number, a size over its
bound. Bytes (request bodies) travel as base64; samples and send times as base64 of little-endian
float64 columns (exact; for 200 000 samples 4.3 MB and ~0.05 s to encode and decode, where JSON numbers
take 9.4 MB and ~0.4 s). Large values travel in batches (payloads, samples), so no message nears
wire.MAX_MESSAGE_BYTES.

Coordinator -> generator: `plan` (+ `payloads` batches), `clock`, `level` (a share: users, a rate
or a schedule), `extend`, `stop`. Generator -> coordinator: `clock`, `samples` batches (the last one
marked), `done` (its LevelStats, then its samples). A level's figures travel as the typed model
:class:`LevelMessage` (camelCase, the results' own part models), validated once where it arrives.
Used by :mod:`servinglab.loadgen.generators` over :class:`servinglab.loadgen.wire.Channel`; importable
without gevent (the plans' classes are imported when a plan is decoded).
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic

from servinglab.api import GeneratorLimits, RequestProtocol, ResponseCheck, StabilitySpec
from servinglab.api.meta import brief_error
from servinglab.loadgen import shapes
from servinglab.loadgen.level_message import MAX_ERROR_KIND, MAX_TEXT, LevelMessage
from servinglab.loadgen.payloads import Payload
from servinglab.loadgen.stats import LevelStats, Sample
from servinglab.loadgen.wire import Channel, Message, WireError

if TYPE_CHECKING:
    from servinglab.loadgen.closed_loop import LoadPlan
    from servinglab.loadgen.open_loop import OpenLoopPlan

#: Samples per `samples` message (3.2 MB of columns, 4.3 MB in base64).
SAMPLES_PER_MESSAGE = 200_000
#: Request bodies per `payloads` message stop growing past this many bytes (base64).
PAYLOAD_BATCH_BYTES = 16 << 20
_LITTLE = sys.byteorder == "little"
_Model = TypeVar("_Model", bound=pydantic.BaseModel)


class MessageError(WireError):
    """A message that is not what the protocol says at this point; names what is wrong."""


# -- checked fields -----------------------------------------------------------------------------


def expect(message: Message, kind: str) -> Message:
    if message.get("kind") != kind:
        raise MessageError(f"expected a {kind!r} message, got {str(message.get('kind'))[:40]!r}")
    return message


class _Fields:
    """A JSON object's fields, each checked for its type as it is read; errors name `where` and the field."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise MessageError(f"{where} is not an object")
        self.value: Message = value
        self.where = where

    def get(self, name: str, types: type | tuple[type, ...], optional: bool = False) -> Any:
        value = self.value.get(name)
        if value is None and optional:
            return None
        kinds = types if isinstance(types, tuple) else (types,)
        # a bool is an int to Python, never to this protocol
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            raise MessageError(f"{self.where}: {name!r} is missing or not {names}")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise MessageError(f"{self.where}: {name!r} is longer than {MAX_TEXT} characters")
        return value

    def number(self, name: str, optional: bool = False) -> float | None:
        value = self.get(name, (int, float), optional)
        if value is None:
            return None
        if not _finite(value):
            raise MessageError(f"{self.where}: {name!r} is not a finite number")
        return float(value)

    def real(self, name: str) -> float:
        value = self.number(name)
        assert value is not None
        return value

    def model(self, name: str, model: type[_Model], optional: bool = False) -> _Model | None:
        value = self.get(name, dict, optional)
        if value is None:
            return None
        try:
            return model.model_validate(value)
        except pydantic.ValidationError as exc:
            raise MessageError(f"{self.where}: {name!r}: {exc.errors()[0]['msg']}") from None

    def binary(self, name: str) -> bytes:
        value = self.value.get(name)
        if not isinstance(value, str):
            raise MessageError(f"{self.where}: {name!r} is missing or not base64 text")
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise MessageError(f"{self.where}: {name!r} is not base64") from None

    def column(self, name: str, code: str = "d") -> array[Any]:
        """A column of float64 (`d`) or int64 (`q`) values, sent little-endian in base64."""
        raw, column = self.binary(name), array(code)
        if len(raw) % column.itemsize:
            raise MessageError(f"{self.where}: {name!r} is not a whole number of values")
        column.frombytes(raw)
        if not _LITTLE:
            column.byteswap()
        if code == "d" and not all(map(math.isfinite, column)):
            raise MessageError(f"{self.where}: {name!r} holds a value that is not a finite number")
        return column

    def objects(self, name: str) -> list[_Fields]:
        return [_Fields(item, f"{self.where}: {name}[{i}]") for i, item in enumerate(self.get(name, list))]


def _finite(value: Any) -> bool:
    """A JSON number that is a float: not a bool, not an integer of 400 digits, not NaN or infinite."""
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _floats(values: Sequence[float], code: str = "d") -> str:
    column = array(code, values)
    if not _LITTLE:
        column.byteswap()
    return base64.b64encode(column.tobytes()).decode()


# -- plans ---------------------------------------------------------------------------------------


def plan_messages(loop: str, plan: LoadPlan | OpenLoopPlan) -> list[Message]:
    """A generator's plan: its settings, then its request bodies in batches."""
    header: Message = {
        "kind": "plan", "loop": loop, "target": plan.target, "path": plan.path,
        "requestTimeoutSeconds": plan.request_timeout_seconds,
        "check": plan.check.model_dump(by_alias=True, mode="json") if plan.check is not None else None,
        "protocol": plan.protocol.model_dump(by_alias=True, mode="json"),
        "stability": plan.stability.model_dump(by_alias=True, mode="json"),
        "generatorLimits": plan.generator_limits.model_dump(by_alias=True, mode="json"),
        "payloadOffset": plan.payload_offset, "payloadCount": len(plan.payloads),
    }  # fmt: skip
    if loop == "closed":
        header["locustStats"] = getattr(plan, "locust_stats", False)
    else:
        header.update(arrival=getattr(plan, "arrival", "poisson"), maxInFlight=getattr(plan, "max_in_flight", 1),
                      seed=getattr(plan, "seed", 0))  # fmt: skip
    messages: list[Message] = [header]
    batch: list[dict[str, str]] = []
    size = 0
    for payload in plan.payloads:
        body = base64.b64encode(payload.body).decode()
        if batch and size + len(body) > PAYLOAD_BATCH_BYTES:
            messages.append({"kind": "payloads", "items": batch})
            batch, size = [], 0
        batch.append({"contentType": payload.content_type, "body": body})
        size += len(body)
    if batch:
        messages.append({"kind": "payloads", "items": batch})
    return messages


def read_plan(header: Message, channel: Channel) -> tuple[str, LoadPlan | OpenLoopPlan]:
    """The plan whose `plan` message is `header`, with its bodies read from `channel`."""
    # imported here: they import Locust, which patches the process with gevent (only where plans run)
    from servinglab.loadgen.closed_loop import LoadPlan
    from servinglab.loadgen.open_loop import OpenLoopPlan

    fields = _Fields(expect(header, "plan"), "'plan' message")
    loop = fields.get("loop", str)
    if loop not in ("closed", "open"):
        raise MessageError(f"'plan' message: 'loop' is {loop[:20]!r}, not 'closed' or 'open'")
    count = fields.get("payloadCount", int)
    payloads: list[Payload] = []
    while len(payloads) < count:
        batch = _Fields(expect(channel.recv(), "payloads"), "'payloads' message")
        payloads += [Payload(item.binary("body"), item.get("contentType", str)) for item in batch.objects("items")]
        if len(payloads) > count:
            raise MessageError(f"'payloads' messages: more bodies than the {count} the plan announced")
    common: Message = {
        "target": fields.get("target", str), "path": fields.get("path", str), "payloads": payloads,
        "request_timeout_seconds": fields.real("requestTimeoutSeconds"),
        "check": fields.model("check", ResponseCheck, optional=True),
        "protocol": fields.model("protocol", RequestProtocol),
        "stability": fields.model("stability", StabilitySpec),
        "generator_limits": fields.model("generatorLimits", GeneratorLimits),
        "payload_offset": fields.get("payloadOffset", int),
    }  # fmt: skip
    if loop == "closed":
        return loop, LoadPlan(**common, locust_stats=fields.get("locustStats", bool))
    arrival = fields.get("arrival", str)
    if arrival not in ("poisson", "constant"):
        raise MessageError(f"'plan' message: 'arrival' is {arrival[:20]!r}, not 'poisson' or 'constant'")
    plan = OpenLoopPlan(**common, arrival=arrival, max_in_flight=fields.get("maxInFlight", int),
                        seed=fields.get("seed", int))  # fmt: skip
    return loop, plan


# -- orders --------------------------------------------------------------------------------------


Share = int | float | shapes.Schedule


def level(share: Share, index: int, measure_from: float, warmup_seconds: float, duration_seconds: float) -> Message:
    """A generator's order for one level: its share (users, a rate or a schedule), the level's index
    in the run and the common time its measured period starts (on the generator's clock)."""
    encoded: Message
    if isinstance(share, shapes.Schedule):
        encoded = {"schedule": _schedule(share)}
    elif isinstance(share, int):
        encoded = {"users": share}
    else:
        encoded = {"rateRps": share}
    return {"kind": "level", "share": encoded, "index": index, "measureFrom": measure_from,
            "warmupSeconds": warmup_seconds, "durationSeconds": duration_seconds}  # fmt: skip


def read_level(message: Message) -> tuple[Share, int, float, float, float]:
    """(share, index, measure_from, warmup_seconds, duration_seconds) of a `level` message."""
    fields = _Fields(expect(message, "level"), "'level' message")
    encoded = _Fields(fields.get("share", dict), "'level' message: share")
    share: Share
    if "schedule" in encoded.value:
        share = _read_schedule(_Fields(encoded.get("schedule", dict), "'level' message: schedule"))
    elif "users" in encoded.value:
        share = encoded.get("users", int)
    else:
        share = encoded.real("rateRps")
    measure_from, warmup, duration = (fields.real(name) for name in ("measureFrom", "warmupSeconds", "durationSeconds"))
    return share, fields.get("index", int), measure_from, warmup, duration


def _schedule(schedule: shapes.Schedule) -> Message:
    return {
        "offsets": _floats(schedule.offsets), "warmupSeconds": schedule.warmup_seconds,
        "measuredSeconds": schedule.measured_seconds, "shape": schedule.kind, "senders": schedule.senders,
        "payloadIndices": _floats(schedule.payload_indices, "q") if schedule.payload_indices is not None else None,
        "phases": [{"name": p.name, "start": p.start, "end": p.end, "rateRps": p.rate_rps, "users": p.users}
                   for p in schedule.phases],
    }  # fmt: skip


def _read_schedule(fields: _Fields) -> shapes.Schedule:
    phases = tuple(
        shapes.Phase(phase.get("name", str), phase.real("start"), phase.real("end"), phase.real("rateRps"),
                     phase.get("users", int, optional=True))
        for phase in fields.objects("phases")
    )  # fmt: skip
    indices = fields.column("payloadIndices", "q") if fields.value.get("payloadIndices") is not None else None
    return shapes.Schedule(
        offsets=tuple(fields.column("offsets")), warmup_seconds=fields.real("warmupSeconds"),
        measured_seconds=fields.real("measuredSeconds"), phases=phases,
        payload_indices=tuple(indices) if indices is not None else None, kind=fields.get("shape", str),
        senders=fields.get("senders", int),
    )  # fmt: skip


def extend(seconds: float) -> Message:
    """The coordinator's decision at the end of a measured period: measure `seconds` more (0: stop)."""
    return {"kind": "extend", "seconds": seconds}


def read_extend(message: Message) -> float:
    return _Fields(expect(message, "extend"), "'extend' message").real("seconds")


def clock(now: float | None = None) -> Message:
    """The coordinator's question (no time) and the generator's answer (its clock)."""
    return {"kind": "clock"} if now is None else {"kind": "clock", "time": now}


def read_clock(message: Message) -> float:
    return _Fields(expect(message, "clock"), "'clock' message").real("time")


STOP: Message = {"kind": "stop"}


# -- results ------------------------------------------------------------------------------------


def send_samples(channel: Channel, samples: Sequence[Sample]) -> None:
    """Samples in batches of SAMPLES_PER_MESSAGE, the last one marked (one, empty, if there are none)."""
    for start in range(0, max(len(samples), 1), SAMPLES_PER_MESSAGE):
        batch = samples[start : start + SAMPLES_PER_MESSAGE]
        channel.send({
            "kind": "samples", "sentAt": _floats([s.sent_at for s in batch]),
            "latencyMs": _floats([s.latency_ms for s in batch]),
            "errors": [[i, s.error] for i, s in enumerate(batch) if s.error is not None],
            "last": start + SAMPLES_PER_MESSAGE >= len(samples),
        })  # fmt: skip


def receive_samples(channel: Channel, deadline: float | None = None) -> list[Sample]:
    """Every batch of samples up to the last one, all by `deadline` (monotonic) when there is one."""
    samples: list[Sample] = []
    while True:
        fields = _Fields(expect(channel.recv(deadline=deadline), "samples"), "'samples' message")
        sent, latency = fields.column("sentAt"), fields.column("latencyMs")
        if len(sent) != len(latency) or len(sent) > SAMPLES_PER_MESSAGE:
            raise MessageError(f"'samples' message: {len(sent)} send times for {len(latency)} latencies")
        errors: dict[int, str] = {}
        for pair in fields.get("errors", list):
            if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and 0 <= pair[0] < len(sent)
                    and isinstance(pair[1], str) and 0 < len(pair[1]) <= MAX_ERROR_KIND):  # fmt: skip
                raise MessageError("'samples' message: an error is not [sample index, kind]")
            errors[pair[0]] = pair[1]
        samples += [Sample(at, ms, errors.get(i)) for i, (at, ms) in enumerate(zip(sent, latency, strict=True))]
        if fields.get("last", bool):
            return samples


def send_done(channel: Channel, stats: LevelStats) -> None:
    """A generator's level: its figures, then the samples it has not sent yet."""
    channel.send(LevelMessage.of(stats).model_dump(mode="json", by_alias=True, exclude_none=True))
    send_samples(channel, stats.samples)


def receive_done(channel: Channel, deadline: float | None = None) -> LevelStats:
    """A generator's level as it sent it (:func:`send_done`), all by `deadline` (monotonic) when there is one."""
    message = expect(channel.recv(deadline=deadline), "done")
    try:
        figures = LevelMessage.model_validate(message, strict=True)
    except pydantic.ValidationError as exc:
        problems = [brief_error(error) for error in exc.errors()[:5]]
        raise MessageError("'done' message: " + "; ".join(problems)) from None
    return figures.stats(tuple(receive_samples(channel, deadline)))
