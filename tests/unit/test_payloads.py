"""Generated payloads: decodable by the handler at the requested size, deterministic per seed."""

from __future__ import annotations

import pytest

from servinglab.api import PayloadFormat
from servinglab.loadgen.payloads import make_payloads
from servinglab_imaging import decode_image


@pytest.mark.parametrize("fmt", list(PayloadFormat))
def test_payloads_decode_to_the_model_input_size(fmt: PayloadFormat) -> None:
    payloads = make_payloads(fmt, 64, 3, seed=1)
    assert len(payloads) == 3
    assert len(set(payloads)) == 3
    for body in payloads:
        assert decode_image(body, 64).shape == (64, 64, 3)


def test_same_seed_same_bytes() -> None:
    assert make_payloads(PayloadFormat.PNG, 32, 2, 5) == make_payloads(PayloadFormat.PNG, 32, 2, 5)
    assert make_payloads(PayloadFormat.PNG, 32, 2, 5) != make_payloads(PayloadFormat.PNG, 32, 2, 6)
