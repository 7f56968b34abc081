"""send/recv match by tag, as on gloo: a recv from a rank takes the earliest message of that rank
with its tag, whatever that rank sent before it with other tags. The same exchange runs on gloo
in the same test, with the same expected values (each payload is a function of sender and tag)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from dist_utils import run_ranks

BIG = (3 << 20) // 4  # float32 elements: 3 MiB, three times a pair's shared-memory ring


def payload(sender: int, tag: int, numel: int = 8) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) + 1000 * sender + tag


def received(src, tag, numel=8):
    t = torch.empty(numel)
    dist.recv(t, src, tag=tag)
    return torch.equal(t, payload(src, tag, numel))


def tags_out_of_order(rank, world):
    seen = {}
    if rank == 0:
        works = [dist.isend(payload(0, tag, BIG if tag == 3 else 8), 1, tag=tag) for tag in (1, 2, 3, 4)]
        works += [dist.isend(payload(0, 7) + i, 1, tag=7) for i in range(2)]
        for w in works:
            w.wait()
        dist.barrier()
        for tag in (20, 21):
            dist.send(payload(0, tag), 1, tag=tag)
    elif rank == 1:
        # The last message first: the three before it (one larger than the ring) are set aside.
        seen["past three"] = [received(0, 4), received(0, 2), received(0, 3, BIG), received(0, 1)]
        first, second = torch.empty(8), torch.empty(8)
        dist.recv(first, 0, tag=7)
        dist.recv(second, 0, tag=7)  # one tag: in send order
        seen["same tag in order"] = [torch.equal(first, payload(0, 7)), torch.equal(second, payload(0, 7) + 1)]
        # A recv from rank 2 gets past its tag-10 message; a recv from any source then takes it.
        seen["from 2"] = received(2, 11)
        any_source = torch.empty(8)
        sender = dist.recv(any_source, None, tag=10)
        seen["any source"] = (sender, torch.equal(any_source, payload(2, 10)))
        # A recv from any source gets past rank 2's tag-12 message too.
        sender = dist.recv(any_source, None, tag=13)
        seen["any source, past one"] = (sender, torch.equal(any_source, payload(2, 13)), received(2, 12))
        # Posted before the sends, in the other order.
        late, early = torch.empty(8), torch.empty(8)
        works = [dist.irecv(late, 0, tag=21), dist.irecv(early, 0, tag=20)]
        dist.barrier()
        for w in works:
            w.wait()
        seen["posted first"] = [torch.equal(early, payload(0, 20)), torch.equal(late, payload(0, 21))]
    else:
        # isend: on gloo a send completes only once its recv is posted (tag 10's comes last).
        for w in [dist.isend(payload(2, tag), 1, tag=tag) for tag in (10, 11, 12, 13)]:
            w.wait()
        dist.barrier()
    return seen


def expected_on_receiver():
    return {"past three": [True] * 4, "same tag in order": [True, True], "from 2": True,
            "any source": (2, True), "any source, past one": (2, True, True), "posted first": [True, True]}


def test_tags_out_of_order_match_as_on_gloo():
    for backend in ("hoccl", "gloo"):
        results = run_ranks(tags_out_of_order, 3, backend=backend, timeout=120)
        assert results[1] == expected_on_receiver(), f"{backend}: {results[1]}"


def stashed_size_mismatch(rank, world):
    if rank == 0:
        works = [dist.isend(payload(0, tag, numel), 1, tag=tag) for tag, numel in ((40, 5), (41, 3), (42, 6))]
        for w in works:
            w.wait()
        return None
    seen = {"41": received(0, 41, 3)}  # gets past tag 40's 20 bytes
    try:
        dist.recv(torch.empty(4), 0, tag=40)
        seen["40"] = "no error"
    except Exception as e:  # noqa: BLE001 - the message is the result
        seen["40"] = str(e)
    seen["42 after"] = received(0, 42, 6)
    return seen


def test_a_set_aside_message_of_another_size_raises_on_its_recv():
    seen = run_ranks(stashed_size_mismatch, 2, timeout=120)[1]
    assert seen["41"] is True and seen["42 after"] is True, seen
    assert "hoccl recv from rank 0 (tag 40, 16 bytes) on rank 1: rank 0 sent 20 bytes with tag 40 but this " \
           "recv expects 16 bytes with tag 40" in seen["40"], seen["40"]
