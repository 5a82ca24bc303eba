"""What every `servinglab` command shares: the command group, the console, and how a command prints,
writes JSON and fails with a named exit code (:class:`~servinglab.api.exitcodes.ExitCode`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click
from pydantic import BaseModel
from rich.console import Console

from servinglab import __version__
from servinglab.api.cost import MAX_PRICE_PER_HOUR
from servinglab.api.results import to_json

console = Console(stderr=True)


@click.group()
@click.version_option(__version__, prog_name="servinglab")
def main() -> None:
    """Which server configuration serves this model best within its SLO: measured, with numbers you can
    trust."""


#: `--price-per-hour`: a replica's price per hour, which overrides the spec's `cost` (the template's, in a sweep).
price_option = click.option(
    "--price-per-hour", type=click.FloatRange(min=0, min_open=True, max=MAX_PRICE_PER_HOUR),
    help="What one server replica costs per hour (overrides spec.cost.pricePerHour): each level's cost per million.",
)  # fmt: skip


def say(line: str) -> None:
    console.print(line, highlight=False)


def write_json(document: BaseModel, output: Path) -> None:
    """To the file, or to stdout when it is '-'."""
    text = json.dumps(to_json(document), indent=2) + "\n"
    if str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text)


def fail(message: str, code: int) -> NoReturn:
    # not wrapped: a message naming a long path stays one greppable line in logs and pipes
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
