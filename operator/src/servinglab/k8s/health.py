"""Is a running operator healthy? Used by `servinglab check-operator`, the Helm chart's test hook.

Healthy means: kopf's liveness endpoint answers 200 (the operator's watch loops are alive), and the
metrics endpoint serves the operator's own metric families.
"""

from __future__ import annotations

import urllib.error
import urllib.request

METRIC_PREFIX = "servinglab_"


class OperatorUnhealthy(RuntimeError):
    """The message names the URL and what was wrong."""


def _get(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        raise OperatorUnhealthy(f"{url} answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise OperatorUnhealthy(f"{url} did not answer: {exc}") from None


def check_operator(health_url: str, metrics_url: str, timeout: float = 10.0) -> int:
    """Raise :class:`OperatorUnhealthy` unless both endpoints answer; return the metric families seen."""
    _get(health_url, timeout)
    families = {
        line.split()[2]
        for line in _get(metrics_url, timeout).splitlines()
        if line.startswith("# TYPE ") and line.split()[2].startswith(METRIC_PREFIX)
    }
    if not families:
        raise OperatorUnhealthy(f"{metrics_url} serves no {METRIC_PREFIX}* metrics")
    return len(families)
