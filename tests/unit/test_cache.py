"""The watch-fed cache's store: what the operator wrote itself is read back at once, and neither a late
watch event nor a list taken before the write takes it back (the GPU queue relies on this: an admission
it has written must count before the watch brings it)."""

from __future__ import annotations

from typing import Any, cast

from servinglab.k8s.cache import Informer
from servinglab.k8s.client import Kube, Ref


def obj(name: str, version: int, state: str = "queued") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(version)}, "state": state}


def store() -> tuple[Informer[str], list[int]]:
    changes: list[int] = []
    informer = Informer(
        cast(Kube, None),  # the store's logic needs no API: run() is what lists and watches
        Ref("v1", "Pod", "ns"),
        lambda o: None if o["state"] == "done" else str(o["state"]),
        on_change=lambda: changes.append(1),
    )
    return informer, changes


def test_the_operators_own_write_is_read_at_once_and_a_late_event_does_not_undo_it() -> None:
    informer, changes = store()
    informer.event("ADDED", obj("a", 10))
    informer.offer(obj("a", 12, "admitted"))  # what a status patch returned
    assert informer.get("ns", "a") == "admitted"
    informer.event("MODIFIED", obj("a", 11, "queued"))  # the watch, still behind
    assert informer.get("ns", "a") == "admitted"
    informer.event("MODIFIED", obj("a", 12, "admitted"))
    informer.event("MODIFIED", obj("a", 13, "queued"))  # a later change by someone else wins
    assert informer.get("ns", "a") == "queued"
    assert len(changes) == 3  # added, admitted, queued again: an equal digest is no change


def test_an_object_whose_digest_is_none_is_dropped_and_a_stale_event_does_not_bring_it_back() -> None:
    informer, _ = store()
    informer.event("ADDED", obj("a", 10))
    informer.offer(obj("a", 12, "done"))
    assert informer.get("ns", "a") is None
    informer.event("MODIFIED", obj("a", 11))
    assert informer.get("ns", "a") is None
    informer.event("DELETED", obj("b", 14))
    informer.event("MODIFIED", obj("a", 15))  # past the write: the watch speaks for it again
    assert informer.get("ns", "a") == "queued"


def test_a_list_drops_what_is_gone_but_keeps_a_write_newer_than_itself() -> None:
    informer, _ = store()
    informer.replace([obj("a", 10), obj("b", 10)], "10")
    informer.offer(obj("c", 21, "admitted"))  # created and written while the next list was on its way
    informer.offer(obj("a", 22, "admitted"))
    informer.replace([obj("a", 19)], "20")
    assert informer.values() == ["admitted", "admitted"]
    assert informer.get("ns", "b") is None
