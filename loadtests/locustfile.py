"""Drive a running TorchServe with servinglab's load user from Locust's own command line or web UI.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --model resnet50 \
        --payload-format jpeg --image-size 224

For measured experiments use `servinglab run` (local) or `servinglab loadtest` (the Kubernetes Job):
they run the same user class level by level, exclude warm-up and report exact percentiles. This file
is for exploring a server by hand with Locust's UI, whose percentiles are Locust's rounded ones.
"""

from locust import events

from typing import Any

from servinglab.api import PayloadFormat
from servinglab.loadgen.closed_loop import InferenceUser, LoadPlan
from servinglab.loadgen.payloads import CONTENT_TYPES, Payload, make_payloads

__all__ = ["InferenceUser"]


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--model", default="resnet50", help="TorchServe model name")
    parser.add_argument("--payload-format", default="jpeg", choices=[str(f) for f in PayloadFormat])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--request-timeout", type=float, default=60.0)


@events.init.add_listener
def _plan(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    fmt = PayloadFormat(options.payload_format) if options else PayloadFormat.JPEG
    size = options.image_size if options else 224
    plan = LoadPlan(
        target=environment.host or "http://127.0.0.1:8080",
        path=f"/predictions/{options.model if options else 'resnet50'}",
        payloads=[Payload(body, CONTENT_TYPES[fmt]) for body in make_payloads(fmt, size, 8, seed=0)],
        request_timeout_seconds=options.request_timeout if options else 60.0,
        locust_stats=True,  # this file is for Locust's UI: feed its statistics
    )
    plan.sending = True
    environment.servinglab_plan = plan
