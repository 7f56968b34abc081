"""Moving expert rows between ranks after a home re-placement: one fixed-shape all_to_all.

A placement is ``logical_at`` [E]: the user's expert at each physical row (row p lives on
rank p // m, local row p % m). Going from one placement to another, every row whose content
changes rank travels once, straight from the rank that holds it to the rank that will. Every
rank sends ``pair_cap`` rows to every peer (rows it has nothing for are zeros), so the
exchange is an all_to_all with even splits: its shape is known without looking at the
placement, and nothing here reads the device from the host. ``HomeReplacer`` keeps every
(source rank, destination rank) pair within ``pair_cap`` rows.

What travels is raw bytes: each row's tensors (weights, gradients, optimizer state, of any
dtype) are viewed as uint8 and concatenated, so a move is bitwise exact.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def exchange_plan(old: torch.Tensor, new: torch.Tensor, rank: int, ranks: int, pair_cap: int):
    """From placement ``old`` to ``new`` (LongTensor [E] each, the same on every rank):

    send_index [ranks * pair_cap]: local row this rank puts at each position of its send
      buffer (position = peer * pair_cap + slot; m = a zero row);
    take [m]: for each of this rank's rows after the move, its row in cat(local rows before,
      received rows).
    Inside a (source, destination) pair, rows go in order of their destination row."""
    e = old.shape[0]
    m = e // ranks
    row = torch.arange(e, device=old.device)
    where_now = torch.empty_like(old).scatter_(0, old, row)  # expert -> row before
    src = where_now.index_select(0, new)  # row before of each row's new content
    sg, dg = src // m, row // m
    moved = sg != dg
    pair = torch.where(moved, sg * ranks + dg, ranks * ranks)
    slot = ((pair[None, :] == pair[:, None]) & (row[None, :] < row[:, None])).sum(1)
    mine = moved & (sg == rank)
    dump = ranks * pair_cap
    send_index = torch.full((dump + 1,), m, dtype=torch.long, device=old.device).scatter_(
        0, torch.where(mine, dg * pair_cap + slot, dump), torch.where(mine, src % m, m))[:dump]
    here = slice(rank * m, (rank + 1) * m)
    take = torch.where(moved[here], m + sg[here] * pair_cap + slot[here], src[here] % m)
    return send_index, take


def exchange(rows: torch.Tensor, send_index: torch.Tensor, take: torch.Tensor, group=None):
    """rows [m, B] (uint8) -> this rank's rows after the move [m, B]."""
    pad = torch.cat([rows, rows.new_zeros((1, rows.shape[1]))])
    send = pad.index_select(0, send_index).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat([rows, recv]).index_select(0, take)


def as_bytes(field) -> torch.Tensor:
    """A field is a tensor [m, ...] (one row per expert) or a list of m tensors (one per
    expert): its bytes [m, nbytes]."""
    if isinstance(field, torch.Tensor):
        return field.detach().contiguous().view(field.shape[0], -1).view(torch.uint8)
    return torch.stack([t.detach().contiguous().reshape(-1).view(torch.uint8)
                        for t in field])


def write_bytes(field, data: torch.Tensor) -> None:
    """Inverse of ``as_bytes``: copy data [m, nbytes] into the field's tensors in place
    (tensor identities stay: optimizers and autograd keep their references)."""
    # a fresh copy: a column slice of the exchanged bytes need not start where the dtype
    # can be viewed; in the copy every row starts at a multiple of its width
    data = data.clone(memory_format=torch.contiguous_format)
    with torch.no_grad():
        if isinstance(field, torch.Tensor):
            field.copy_(data.view(field.dtype).view(field.shape))
            return
        for t, d in zip(field, data):
            t.copy_(d.view(t.dtype).view(t.shape))


def move_rows(fields: list, send_index, take, group=None) -> int:
    """Move every field's rows as the plan says, in one exchange. Returns the bytes this
    rank's exchange sends (padding included)."""
    if not fields:
        return 0
    parts = [as_bytes(f) for f in fields]
    widths = [p.shape[1] for p in parts]
    out = exchange(torch.cat(parts, 1), send_index, take, group)
    off = 0
    for f, w in zip(fields, widths):
        write_bytes(f, out[:, off:off + w])
        off += w
    return send_index.shape[0] * sum(widths)
