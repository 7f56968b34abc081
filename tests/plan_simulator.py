"""Runs every rank's Plan of one collective together, in one process, over byte buffers.

The plans come from the real builders (`_C.build_plan`, cuda/python/plan_bindings.cpp); the
simulator plays the executor (cuda/exec/executor.cpp) and the transports for all ranks at once,
and checks what a real run would only get wrong now and then. It is independent of the C++
executor: copies are byte copies, reductions are torch ops that reproduce the executor's
arithmetic (cuda/common/reduce_kernels.cpp), and the synchronisation model is written from the IR's
contract (cuda/common/plan_types.h).

Memory. Per rank: its In and Out blocks (torch tensors given by the caller, viewed as bytes; the
same tensor may be both, as the backend passes it for all_reduce, reduce and broadcast; a block
may be None where the backend passes a null pointer), two staging buffers of `slot_bytes`
(a plan's `Slot` buffer b is physical buffer (cursor + b) & 1, the cursor advancing by
`buffers_used` after each plan, as the executor's), and a private Scratch of the plan's
`scratch_bytes`, fresh for each plan.

Synchronisation.
- Barriers: the executor numbers every barrier of a rank in one sequence and the local transport
  waits for the ranks of the rank's host, so the k-th barrier of a rank meets the k-th barrier
  of every rank on its host, and they must all have the same scope. A "group" barrier waits for
  every rank, which on one host is the same set; in a request across hosts (host_of with more
  than one host) a group barrier is an error, as the executor throws on one.
- Send / Recv / Wait: the k-th send from s to d matches the k-th recv of d from s within one
  op (MPI non-overtaking); sizes must agree; the peer must be on another host. A Wait on a recv
  finishes once the matching send is posted (the data lands then, in the Wait); a Wait on a send
  finishes once the matching recv is posted (rendezvous: a plan may not rely on the transport
  buffering a message). A send's bytes are snapshotted at its post (that is what the receiver
  gets) and must be unchanged at the receiver's Wait and at its own; every transfer of a plan must be waited before the plan ends, and no transfer may be left
  unmatched at the end of the op.
- Deadlock: when no rank can advance and some have not finished, SimulationError lists where
  each rank is blocked.

Races (happens-before, with vector clocks). Every step of a rank ticks its clock; a barrier joins
the clocks of the ranks it releases; the Wait of a recv joins the sender's clock at its post (a
send's completion orders nothing for the sender). For every byte of every buffer the simulator
keeps its last writer and, per rank, its latest read since then, and flags:
- a read of bytes whose last write is not ordered before it (read before the barrier or message
  that makes the data valid, e.g. a slot read without a barrier after its writer's copy);
- a write of bytes whose last write, or a read of any other rank since, is not ordered before it
  (a slot overwritten while a peer may still read it, two ranks writing the same bytes);
- a read of bytes nobody wrote in this op (a staging slot never filled, stale from an earlier
  op; Out bytes not yet produced; Scratch not yet received into);
- any access to the destination of a recv between its post and its Wait, and any write to the
  source of a send between its post and its Wait;
- the caller's ownership: each rank's blocks are written by the rank at its start (In: the data,
  Out: unwritten) and again when it returns from the op, so a peer that reads them before a
  barrier after the owner joined, or that may still read them after the owner returned (a
  direct-read plan without its final barrier), is a race.
Because the check is of the happens-before order and not of the interleaving that happened to
run, a race is flagged in every order the ranks are run in (`order="random"` also runs them
interleaved step by step with a seed, to exercise the scheduler itself).
Also checked: indices and bounds of every location, slots and peer blocks only of ranks on the
same host, slot buffers within the plan's buffers_used, the plans of every rank of a host
agreeing on buffers_used (each host's slots have a cursor of their own, as the executors of its
ranks keep it), transfer and message numbering, copies whose source and destination overlap
partly, and reductions whose destination overlaps a source other than exactly.

`run_layout(request, host_of, inputs, ...)` builds every rank's plan of a request with the real
builders, lays out the blocks as the backend does for the op and runs them; `expected_outputs`
gives what every rank must then hold, from the independent references of
tests/collective_checks.py.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

NEVER = -1  # the writer of a byte never written
INF = np.iinfo(np.int64).max


class SimulationError(AssertionError):
    """A plan (or set of plans) that a real run could execute wrongly, hang on or crash on."""


def build_plans(request: dict, world: int | None = None) -> list[dict]:
    """Every rank's plan of `request` (a PlanRequest dict without `rank`)."""
    from hoccl_backend import _C

    world = request.get("world", world)
    if world is None:
        raise ValueError("build_plans: the request has no world")
    return [_C.build_plan(dict(request, world=world, rank=r)) for r in range(world)]


# ---------------------------------------------------------------------------------------------
# Formatting (as Plan::describe in cuda/common/plan_types.cpp)


def net_steps(plan: dict) -> list[tuple]:
    """A plan's network transfers in order: (kind, peer, bytes) of its Send and Recv steps."""
    return [(s["kind"], s["peer"], s["bytes"]) for s in plan["steps"] if s["kind"] in ("send", "recv")]


def fmt_loc(loc: dict) -> str:
    s, i, b, o = loc["space"], loc["index"], loc["buf"], loc["offset"]
    if s in ("in", "out"):
        return f"{s}[{i}]+{o}"
    if s == "slot":
        return f"slot[r{i},b{b}]+{o}"
    if s == "scratch":
        return f"scratch+{o}"
    return f"{s}[r{b},{i}]+{o}"


def fmt_step(step: dict) -> str:
    k = step["kind"]
    if k == "copy":
        return f"copy {fmt_loc(step['dst'])} <- {fmt_loc(step['src'])} {step['bytes']}B"
    if k == "reduce":
        srcs = " ".join(fmt_loc(l) for l in step["srcs"])
        return f"reduce {fmt_loc(step['dst'])} <- {srcs} x{step['count']}" + (" finalize" if step["finalize"] else "")
    if k == "barrier":
        return "barrier" + (" host" if step.get("scope") == "host" else "")
    if k == "send":
        return f"send #{step['transfer']} r{step['peer']}.{step['message']} <- {fmt_loc(step['src'])} {step['bytes']}B"
    if k == "recv":
        return f"recv #{step['transfer']} r{step['peer']}.{step['message']} -> {fmt_loc(step['dst'])} {step['bytes']}B"
    if k == "wait":
        return f"wait #{step['transfer']}"
    return repr(step)


def describe(plan: dict) -> str:
    return plan["algo"] + ":\n" + "\n".join(f"  {i:3d} {fmt_step(s)}" for i, s in enumerate(plan["steps"]))


# ---------------------------------------------------------------------------------------------
# Reductions (cuda/common/reduce_kernels.cpp)

REDUCE_OPS = ("sum", "avg", "premul", "product", "min", "max", "band", "bor", "bxor")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def reduce_values(srcs: list[torch.Tensor], dtype: torch.dtype, op: str) -> torch.Tensor:
    """reduceInto: sources combined in order in the accumulator type (float for 16-bit floats),
    converted to dtype once. avg and premul reduce as sum (finalize scales)."""
    acc_t = _acc_dtype(dtype)
    acc = srcs[0].to(acc_t)
    for s in srcs[1:]:
        x = s.to(acc_t)
        if op in ("sum", "avg", "premul"):
            acc = acc | x if dtype == torch.bool else acc + x
        elif op == "product":
            acc = acc & x if dtype == torch.bool else acc * x
        elif op == "min":
            acc = torch.where(x < acc, x, acc)
        elif op == "max":
            acc = torch.where(acc < x, x, acc)
        elif op == "band":
            acc = acc & x
        elif op == "bor":
            acc = acc | x
        elif op == "bxor":
            acc = acc ^ x
        else:
            raise ValueError(f"unknown reduce op {op!r}")
    return acc.to(dtype)


def finalize_values(d: torch.Tensor, dtype: torch.dtype, op: str, factor: float, world: int) -> torch.Tensor:
    """postScale: avg divides by the group's world, premul multiplies by factor; integers
    truncate, floats compute in the accumulator type (float for 16-bit and 32-bit floats)."""
    if op not in ("avg", "premul") or dtype == torch.bool:
        return d
    if not dtype.is_floating_point:
        if op == "avg":
            return torch.div(d, world, rounding_mode="trunc").to(dtype)
        return (d.double() * factor).to(dtype)
    acc_t = _acc_dtype(dtype)
    x = d.to(acc_t)
    if op == "avg":
        x = x / torch.tensor(float(world), dtype=acc_t)
    else:
        x = x * torch.tensor(factor, dtype=acc_t)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------------
# Shadow memory: who wrote and read every byte, in vector-clock time


class _Shadow:
    """Per underlying storage (aliased blocks share one)."""

    def __init__(self, nbytes: int, world: int):
        self.writer = np.full(nbytes, NEVER, np.int64)
        self.wclock = np.zeros(nbytes, np.int64)
        self.wevent = np.full(nbytes, -1, np.int64)
        self.valid = np.zeros(nbytes, bool)  # holds data written in this op (or the caller's input)
        self.rclock = np.full((world, nbytes), -1, np.int64)
        self.revent = np.full((world, nbytes), -1, np.int64)
        self.inflight: list[tuple[int, int, str, int, str]] = []  # (lo, hi, send|recv, rank, what)


@dataclass
class _Region:
    name: str            # for messages: "rank 2's in[1]", "slot of rank 0 (buffer 1)"
    data: torch.Tensor   # uint8 view
    shadow: _Shadow
    base: int            # offset of data in the shadow
    owner: int


@dataclass
class _Transfer:
    rank: int
    kind: str            # send | recv
    peer: int
    nbytes: int
    region: _Region | None
    offset: int
    step_no: int
    posted_vc: np.ndarray
    number: int = -1
    snapshot: torch.Tensor | None = None
    match: "_Transfer | None" = None
    waited: bool = False
    marker: tuple | None = None


@dataclass
class _RankState:
    plans: list[dict]
    plan_no: int = 0
    pc: int = 0
    cursor: int = 0
    scratch: _Region | None = None
    transfers: dict = field(default_factory=dict)   # transfer number -> _Transfer (current plan)
    finished: bool = False
    blocked: str = ""                               # why it cannot advance now
    sent_to: dict = field(default_factory=dict)     # peer -> messages sent this plan
    received_from: dict = field(default_factory=dict)


def _as_bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if not t.is_contiguous():
        raise ValueError("simulator blocks must be contiguous tensors")
    return t.reshape(-1).view(torch.uint8)


class Simulator:
    """The state that outlives one op: staging slots, their cursor, barrier counts, clocks.
    Call run() once per op (several ops in a row share slots, so a later op's overwrite of a
    slot an earlier op's reader may still read is a race too)."""

    def __init__(self, world: int, slot_bytes: int, host_of: list[int] | None = None):
        self.world = world
        self.host_of = list(host_of) if host_of else [0] * world
        if len(self.host_of) != world:
            raise ValueError(f"host_of has {len(self.host_of)} entries for a world of {world}")
        self.hosts = max(self.host_of) + 1
        self.slot_bytes = slot_bytes
        self.vc = [np.zeros(world, np.int64) for _ in range(world)]
        self.events: list[tuple] = []  # (rank, step index, step) or (rank, -1, text): labels, made on demand
        self.activity = [""] * world
        self.shadows: dict[int, _Shadow] = {}
        self.slots = [[self._fresh_region(f"slot of rank {r} (buffer {b})", slot_bytes, r) for b in range(2)]
                      for r in range(world)]
        self.cursors = [0] * self.hosts  # per host: the slot cursor its ranks' executors share
        self.barrier_seq = [0] * world
        self.stats = {"steps": 0, "barriers": 0, "messages": 0, "bytes_sent": 0}

    # -- memory --------------------------------------------------------------------------------

    def _fresh_region(self, name: str, nbytes: int, owner: int) -> _Region:
        data = torch.zeros(max(nbytes, 1), dtype=torch.uint8)[:nbytes]
        sh = _Shadow(nbytes, self.world)
        return _Region(name, data, sh, 0, owner)

    def _region_of(self, t: torch.Tensor, name: str, owner: int) -> _Region:
        if t.numel() == 0:
            return _Region(name, t, _Shadow(0, self.world), 0, owner)
        st = t.untyped_storage()
        key = st.data_ptr()
        sh = self.shadows.get(key)
        if sh is None or sh.writer.shape[0] != st.nbytes():
            sh = self.shadows[key] = _Shadow(st.nbytes(), self.world)
        return _Region(name, t, sh, t.data_ptr() - key, owner)

    def _event(self, r: int, pc: int, what) -> int:
        self.events.append((r, pc, what))
        return len(self.events) - 1

    def _label(self, ev: int) -> str:
        if ev < 0:
            return "unwritten"
        r, pc, what = self.events[ev]
        return f"rank {r} {what}" if pc < 0 else f"rank {r} step {pc}: {fmt_step(what)}"

    def _fail(self, r: int, msg: str):
        st = self.state[r]
        plan = st.plans[st.plan_no] if st.plan_no < len(st.plans) else None
        where = ""
        if self.activity[r]:
            where = f" {self.activity[r]}"
        elif plan is not None and st.pc < len(plan["steps"]):
            where = f" at step {st.pc} ({fmt_step(plan['steps'][st.pc])}) of plan {plan['algo']}"
        raise SimulationError(f"rank {r}{where}: {msg}")

    def _others(self, r: int) -> np.ndarray:
        """Rank r's clock with its own entry (and the 'never written' entry -1) at infinity:
        clock[q] < c means an access at q's time c is not ordered before r's present."""
        v = np.empty(self.world + 1, np.int64)
        v[:-1] = self.vc[r]
        v[r] = INF
        v[-1] = INF
        return v

    def _check_inflight(self, r: int, reg: _Region, lo: int, hi: int, writing: bool):
        for (a, b, kind, owner, what) in reg.shadow.inflight:
            if a < hi and lo < b:
                if kind == "recv":
                    self._fail(r, f"{'writes' if writing else 'reads'} bytes of {reg.name} that {what} of rank "
                                  f"{owner} is receiving into (between its post and its wait)")
                if writing:
                    self._fail(r, f"writes bytes of {reg.name} that {what} of rank {owner} is sending "
                                  f"(between its post and its wait)")

    def _read(self, r: int, reg: _Region, off: int, n: int, ev: int) -> torch.Tensor:
        if n == 0:
            return torch.empty(0, dtype=torch.uint8)
        sh, lo = reg.shadow, reg.base + off
        hi = lo + n
        if sh.inflight:
            self._check_inflight(r, reg, lo, hi, False)
        known = self._others(r)
        late = sh.wclock[lo:hi] > known[sh.writer[lo:hi]]
        if late.any():
            i = int(np.argmax(late))
            self._fail(r, f"reads byte {off + i} of {reg.name}, last written by rank {int(sh.writer[lo + i])} "
                          f"({self._label(sh.wevent[lo + i])}) with no barrier or message ordering that "
                          f"write before this read")
        valid = sh.valid[lo:hi]
        if not valid.all():
            i = int(np.argmin(valid))
            self._fail(r, f"reads byte {off + i} of {reg.name}, which holds no data of this op "
                          f"({self._label(sh.wevent[lo + i])})")
        sh.rclock[r, lo:hi] = self.vc[r][r]
        sh.revent[r, lo:hi] = ev
        return reg.data[off:off + n].clone()

    def _write(self, r: int, reg: _Region, off: int, data: torch.Tensor | None, n: int, ev: int,
               valid: bool | None = True, record: bool = True):
        """data None: a write that changes no byte (ownership changes, a recv's post); valid None:
        leaves the bytes' validity as it is; record False: checks only."""
        if n == 0:
            return
        sh, lo = reg.shadow, reg.base + off
        hi = lo + n
        if sh.inflight:
            self._check_inflight(r, reg, lo, hi, True)
        known = self._others(r)
        late = sh.wclock[lo:hi] > known[sh.writer[lo:hi]]
        if late.any():
            i = int(np.argmax(late))
            self._fail(r, f"overwrites byte {off + i} of {reg.name}, written by rank {int(sh.writer[lo + i])} "
                          f"({self._label(sh.wevent[lo + i])}) with nothing ordering the two writes")
        late = sh.rclock[:, lo:hi] > known[:-1, None]
        if late.any():
            q, i = (int(x) for x in np.unravel_index(np.argmax(late), late.shape))
            self._fail(r, f"overwrites byte {off + i} of {reg.name} that rank {q} read "
                          f"({self._label(sh.revent[q, lo + i])}) and may still be reading: no barrier "
                          f"orders that read before this write")
        if not record:
            return
        sh.writer[lo:hi] = r
        sh.wclock[lo:hi] = self.vc[r][r]
        sh.wevent[lo:hi] = ev
        sh.rclock[:, lo:hi] = -1
        if data is not None:
            reg.data[off:off + n] = data
        if valid is not None:
            sh.valid[lo:hi] = valid

    # -- locations -----------------------------------------------------------------------------

    def _resolve(self, r: int, loc: dict, n: int, what: str) -> tuple[_Region, int]:
        st = self.state[r]
        space, idx, buf, off = loc["space"], loc["index"], loc["buf"], loc["offset"]
        if space in ("in", "out", "peer_in", "peer_out"):
            owner = r if space in ("in", "out") else buf
            if space.startswith("peer"):
                self._check_rank(r, owner, f"{what} {space}")
                if self.host_of[owner] != self.host_of[r]:
                    self._fail(r, f"{what} reads a block of rank {owner}, on host {self.host_of[owner]}, "
                                  f"not this rank's host {self.host_of[r]}")
            blocks = (self.ins if space.endswith("in") else self.outs)[owner]
            if not 0 <= idx < len(blocks):
                self._fail(r, f"{what} names {space} block {idx}; rank {owner} has {len(blocks)}")
            reg = blocks[idx]
            if reg is None:
                if n > 0:
                    self._fail(r, f"{what} uses {space} block {idx} of rank {owner}, which the op leaves null "
                                  f"on that rank")
                return None, off
        elif space == "slot":
            self._check_rank(r, idx, f"{what} slot")
            if self.host_of[idx] != self.host_of[r]:
                self._fail(r, f"{what} uses the slot of rank {idx}, on host {self.host_of[idx]}, not this "
                              f"rank's host {self.host_of[r]}")
            used = st.plans[st.plan_no]["buffers_used"]
            if not 0 <= buf < used:
                self._fail(r, f"{what} uses slot buffer {buf}, outside the plan's buffers_used {used}")
            reg = self.slots[idx][(st.cursor + buf) & 1]
        elif space == "scratch":
            reg = st.scratch
        else:
            self._fail(r, f"{what}: unknown space {space!r}")
        if off < 0 or off + n > reg.data.numel():
            self._fail(r, f"{what} {fmt_loc(loc)} {n}B is out of bounds of {reg.name} ({reg.data.numel()} bytes)")
        return reg, off

    def _check_rank(self, r: int, peer: int, what: str):
        if not 0 <= peer < self.world:
            self._fail(r, f"{what} names rank {peer}, not in a world of {self.world}")

    # -- steps ---------------------------------------------------------------------------------

    def _step(self, r: int) -> bool:
        """Runs rank r's next step. False when it is blocked (state.blocked says why)."""
        st = self.state[r]
        plan = st.plans[st.plan_no]
        step = plan["steps"][st.pc]
        kind = step["kind"]
        if kind == "barrier":
            return self._barrier(r, step)
        if kind == "wait":
            return self._wait(r, step)
        self.vc[r][r] += 1
        ev = self._event(r, st.pc, step)
        if kind == "copy":
            n = step["bytes"]
            src, so = self._resolve(r, step["src"], n, "copy source")
            dst, do = self._resolve(r, step["dst"], n, "copy destination")
            if n == 0:
                st.pc += 1
                self.stats["steps"] += 1
                return True
            same = False
            if src.shadow is dst.shadow:
                a, b = src.base + so, dst.base + do
                if a != b and a < b + n and b < a + n:
                    self._fail(r, "copy source and destination overlap partly")
                same = a == b
            data = self._read(r, src, so, n, ev)
            if not same:  # the executor skips a copy onto itself: a read, no write
                self._write(r, dst, do, data, n, ev)
        elif kind == "reduce":
            self._reduce(r, step, ev)
        elif kind in ("send", "recv"):
            self._post(r, step, ev)
        else:
            self._fail(r, f"unknown step kind {kind!r}")
        st.pc += 1
        self.stats["steps"] += 1
        return True

    def _reduce(self, r: int, step: dict, ev: int):
        if self.dtype is None:
            self._fail(r, "a reduce step, but the simulation was given no dtype")
        es = torch.empty(0, dtype=self.dtype).element_size()
        count = step["count"]
        n = count * es
        dst, do = self._resolve(r, step["dst"], n, "reduce destination")
        if not step["srcs"]:
            self._fail(r, "a reduce step without sources")
        vals = []
        for k, loc in enumerate(step["srcs"]):
            src, so = self._resolve(r, loc, n, f"reduce source {k}")
            if n > 0 and src.shadow is dst.shadow:
                a, b = src.base + so, dst.base + do
                if a != b and a < b + n and b < a + n:
                    self._fail(r, f"reduce source {k} overlaps the destination partly")
        if count == 0:
            return
        for k, loc in enumerate(step["srcs"]):
            src, so = self._resolve(r, loc, n, f"reduce source {k}")
            vals.append(self._read(r, src, so, n, ev).view(self.dtype))
        out = reduce_values(vals, self.dtype, self.op)
        if step["finalize"]:
            out = finalize_values(out, self.dtype, self.op, self.factor, self.world)
        self._write(r, dst, do, out.view(torch.uint8), n, ev)

    def _post(self, r: int, step: dict, ev: int):
        st = self.state[r]
        kind, peer, t, n = step["kind"], step["peer"], step["transfer"], step["bytes"]
        self._check_rank(r, peer, kind)
        if peer == r or self.host_of[peer] == self.host_of[r]:
            self._fail(r, f"{kind} to rank {peer} on the same host {self.host_of[r]}: network transfers are for "
                          f"ranks of other hosts (the local transport moves the rest)")
        if not 0 <= t < st.plans[st.plan_no]["transfers"] or t in st.transfers:
            self._fail(r, f"{kind} has transfer number {t}, not a new one of 0..{st.plans[st.plan_no]['transfers'] - 1}")
        counts = st.sent_to if kind == "send" else st.received_from
        expect = counts.get(peer, 0)
        if step["message"] != expect:
            self._fail(r, f"{kind} is message {step['message']} to/from rank {peer}, expected {expect}")
        counts[peer] = expect + 1
        what = f"{kind} #{t} (step {st.pc})"
        if kind == "send":
            reg, off = self._resolve(r, step["src"], n, "send source")
            tr = _Transfer(r, kind, peer, n, reg, off, st.pc, self.vc[r].copy(), number=t)
            tr.snapshot = self._read(r, reg, off, n, ev)
            self.sends.setdefault((r, peer), []).append(tr)
            self.stats["messages"] += 1
            self.stats["bytes_sent"] += n
        else:
            reg, off = self._resolve(r, step["dst"], n, "recv destination")
            tr = _Transfer(r, kind, peer, n, reg, off, st.pc, self.vc[r].copy(), number=t)
            # Nothing that touched the destination may still be unordered with the landing bytes.
            self._write(r, reg, off, None, n, ev, record=False)
            self.recvs.setdefault((peer, r), []).append(tr)
        if n > 0:
            reg.shadow.inflight.append((reg.base + off, reg.base + off + n, kind, r, what))
            tr.marker = reg.shadow.inflight[-1]
        st.transfers[t] = tr
        self._match()

    def _match(self):
        for key in set(self.sends) & set(self.recvs):
            ss, rs = self.sends[key], self.recvs[key]
            for k in range(min(len(ss), len(rs))):
                s, rv = ss[k], rs[k]
                if s.match is None:
                    if s.nbytes != rv.nbytes:
                        self._fail(rv.rank, f"message {k} from rank {s.rank} to rank {rv.rank}: the send (step "
                                            f"{s.step_no}) has {s.nbytes} bytes, the recv (step {rv.step_no}) "
                                            f"{rv.nbytes}")
                    s.match, rv.match = rv, s

    def _unmark(self, tr: _Transfer):
        if tr.nbytes > 0:
            tr.region.shadow.inflight.remove(tr.marker)

    def _wait(self, r: int, step: dict) -> bool:
        st = self.state[r]
        t = step["transfer"]
        tr = st.transfers.get(t)
        if tr is None or tr.waited:
            self._fail(r, f"waits for transfer #{t}, which is {'already waited' if tr else 'not posted'}")
        if tr.match is None:
            st.blocked = (f"step {st.pc} wait #{t}: the matching "
                          f"{'recv' if tr.kind == 'send' else 'send'} of rank {tr.peer} is not posted")
            return False
        self.vc[r][r] += 1
        ev = self._event(r, st.pc, step)
        if tr.kind == "send":
            self._check_unchanged(tr)
            self._unmark(tr)
            self._read(r, tr.region, tr.offset, tr.nbytes, ev)
        else:
            s = tr.match
            if not s.waited:
                self._check_unchanged(s)
            self._unmark(tr)
            np.maximum(self.vc[r], s.posted_vc, out=self.vc[r])
            self._write(r, tr.region, tr.offset, s.snapshot, tr.nbytes, ev)
        tr.waited = True
        st.blocked = ""
        st.pc += 1
        self.stats["steps"] += 1
        return True

    def _check_unchanged(self, s: _Transfer):
        if s.nbytes and not torch.equal(s.region.data[s.offset:s.offset + s.nbytes], s.snapshot):
            self._fail(s.rank, f"the source of send #{s.number} (step {s.step_no}) changed before the transfer "
                               f"finished")

    def _barrier(self, r: int, step: dict) -> bool:
        st = self.state[r]
        scope = step.get("scope", "group")
        if scope == "group" and self.hosts > 1:
            self._fail(r, "a group barrier in a plan across hosts (the executor throws on one: hosts "
                          "synchronize with messages)")
        if st.blocked.startswith("barrier"):
            return False  # arrived, not yet released
        self.barrier_seq[r] += 1
        k = self.barrier_seq[r]
        host = self.host_of[r]
        key = (host, k)
        arrivals = self.arrivals.setdefault(key, {})
        arrivals[r] = (scope, st.pc)
        members = [q for q in range(self.world) if self.host_of[q] == host]
        missing = [q for q in members if q not in arrivals]
        if missing:
            st.blocked = f"barrier #{k} ({scope}) at step {st.pc}, waiting for rank(s) {missing}"
            return False
        scopes = {q: a[0] for q, a in arrivals.items()}
        if len(set(scopes.values())) > 1:
            self._fail(r, f"barrier #{k} of host {host} is a group barrier on some ranks and a host barrier "
                          f"on others: {scopes}")
        joined = np.max(np.stack([self.vc[q] for q in members]), axis=0)
        for q in members:
            self.vc[q] = joined.copy()
            qs = self.state[q]
            qs.blocked = ""
            qs.pc += 1
        del self.arrivals[key]
        self.stats["barriers"] += 1
        self.stats["steps"] += len(members)
        return True

    # -- plans and ops -------------------------------------------------------------------------

    def _start_plan(self, r: int):
        st = self.state[r]
        plan = st.plans[st.plan_no]
        st.cursor = self.cursors[self.host_of[r]] + sum(p["buffers_used"] for p in st.plans[:st.plan_no])
        st.scratch = self._fresh_region(f"scratch of rank {r}", plan["scratch_bytes"], r)
        st.transfers = {}
        st.sent_to, st.received_from = {}, {}
        st.pc = 0

    def _end_plan(self, r: int):
        st = self.state[r]
        plan = st.plans[st.plan_no]
        left = sorted(t for t, tr in st.transfers.items() if not tr.waited)
        if left:
            self._fail(r, f"plan {plan['algo']} ends with transfer(s) {left} never waited")
        st.plan_no += 1
        if st.plan_no < len(st.plans):
            self._start_plan(r)
        else:
            st.finished = True
            self._ownership(r, "returned from the op (its blocks are the caller's again)", returning=True)

    def _ownership(self, r: int, text: str, returning: bool):
        """The caller's writes of rank r's blocks: at the start (In data, Out nothing yet), and at
        its return (the caller may reuse them)."""
        self.vc[r][r] += 1
        ev = self._event(r, -1, text)
        self.activity[r] = "returning from the op" if returning else "joining the op"
        for regs, is_in in ((self.outs[r], False), (self.ins[r], True)):
            for reg in regs:
                if reg is None or reg.data.numel() == 0:
                    continue
                n = reg.data.numel()
                if returning:
                    self._write(r, reg, 0, None, n, ev, valid=None)
                else:
                    self._write(r, reg, 0, None, n, ev, valid=is_in)
        self.activity[r] = ""

    def _check_plans(self, plans: list[list[dict]]):
        counts = {len(p) for p in plans}
        if len(counts) != 1:
            raise SimulationError(f"ranks run different numbers of plans: {[len(p) for p in plans]}")
        for i in range(len(plans[0])):
            for h in range(self.hosts):
                used = {r: p[i]["buffers_used"] for r, p in enumerate(plans) if self.host_of[r] == h}
                if len(set(used.values())) > 1:
                    raise SimulationError(f"plan {i}: ranks of host {h} disagree on buffers_used {used} (their "
                                          f"slot cursor would diverge)")
            for r, p in enumerate(plans):
                nt = sum(s["kind"] in ("send", "recv") for s in p[i]["steps"])
                if nt != p[i]["transfers"]:
                    raise SimulationError(f"rank {r} plan {p[i]['algo']}: {nt} send/recv steps but transfers = "
                                          f"{p[i]['transfers']}")

    def run(self, plans, ins, outs, dtype: torch.dtype | None = None, op: str = "sum", factor: float = 2.5,
            order: str = "round_robin", seed: int = 0, max_steps: int = 10_000_000) -> dict:
        """Runs one op: plans[r] is rank r's plan (or list of plans, run back to back, e.g. the
        publishing barrier and then the data plan); ins[r] / outs[r] are rank r's In / Out blocks
        (tensors or None). Outputs are written into the caller's tensors. Returns statistics.
        order: "round_robin" (each rank in turn runs until it blocks) or "random" (a random
        runnable rank runs 1-3 steps; `seed` makes it repeatable)."""
        W = self.world
        plans = [[p] if isinstance(p, dict) else list(p) for p in plans]
        if len(plans) != W or len(ins) != W or len(outs) != W:
            raise ValueError(f"need plans, ins and outs for {W} ranks")
        self._check_plans(plans)
        self.dtype, self.op, self.factor = dtype, op, factor
        self.shadows = {}  # the caller's blocks are the op's only while it runs
        for bufs in self.slots:  # what earlier ops left in the slots is no data of this op
            for reg in bufs:
                reg.shadow.valid[:] = False
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown op {op!r}")
        self.ins = [[None if t is None else self._region_of(_as_bytes(t), f"rank {r}'s in[{b}]", r)
                     for b, t in enumerate(blocks)] for r, blocks in enumerate(ins)]
        self.outs = [[None if t is None else self._region_of(_as_bytes(t), f"rank {r}'s out[{b}]", r)
                      for b, t in enumerate(blocks)] for r, blocks in enumerate(outs)]
        self.state = [_RankState(plans[r]) for r in range(W)]
        self.sends: dict = {}
        self.recvs: dict = {}
        self.arrivals: dict = {}
        for r in range(W):
            self._ownership(r, "joined the op (its In blocks hold the caller's data)", returning=False)
            self._start_plan(r)
        rng = random.Random(seed)
        steps = 0
        while True:
            for r in range(W):  # plans that are done (or empty) end
                st = self.state[r]
                while not st.finished and st.pc >= len(st.plans[st.plan_no]["steps"]):
                    self._end_plan(r)
            live = [r for r in range(W) if not self.state[r].finished]
            if not live:
                break
            progressed = False
            if order == "round_robin":
                for r in live:
                    while not self.state[r].finished and self.state[r].pc < len(
                            self.state[r].plans[self.state[r].plan_no]["steps"]):
                        if not self._step(r):
                            break
                        progressed = True
                        steps += 1
            elif order == "random":
                cands = live[:]
                rng.shuffle(cands)
                for r in cands:
                    burst = rng.randint(1, 3)
                    ran = 0
                    while ran < burst and self.state[r].pc < len(self.state[r].plans[self.state[r].plan_no]["steps"]):
                        if not self._step(r):
                            break
                        ran += 1
                    if ran:
                        progressed = True
                        steps += ran
                        break
            else:
                raise ValueError(f"unknown order {order!r}")
            if steps > max_steps:
                raise SimulationError(f"more than {max_steps} steps")
            if not progressed and all(
                    self.state[r].finished or self.state[r].pc < len(self.state[r].plans[self.state[r].plan_no]["steps"])
                    for r in range(W)):
                self._deadlock()
        unmatched = [f"{tr.kind} of rank {tr.rank} {'to' if tr.kind == 'send' else 'from'} rank {tr.peer} "
                     f"(step {tr.step_no})"
                     for lst in list(self.sends.values()) + list(self.recvs.values()) for tr in lst if tr.match is None]
        if unmatched:
            raise SimulationError("transfers never matched: " + "; ".join(unmatched))
        for h in set(self.host_of):
            first = self.host_of.index(h)
            self.cursors[h] += sum(p["buffers_used"] for p in plans[first])
        return dict(self.stats)

    def _deadlock(self):
        lines = []
        for r, st in enumerate(self.state):
            if st.finished:
                lines.append(f"rank {r}: finished")
            else:
                plan = st.plans[st.plan_no]
                lines.append(f"rank {r}: plan {plan['algo']}, {st.blocked or 'step ' + str(st.pc)}")
        raise SimulationError("deadlock, no rank can advance:\n  " + "\n  ".join(lines))


def simulate(plans, ins, outs, *, slot_bytes: int, host_of=None, dtype=None, op="sum", factor=2.5,
             order="round_robin", seed=0) -> dict:
    """One op on a fresh Simulator (see Simulator.run)."""
    sim = Simulator(len(plans), slot_bytes, host_of)
    return sim.run(plans, ins, outs, dtype=dtype, op=op, factor=factor, order=order, seed=seed)


# ---------------------------------------------------------------------------------------------
# Host layouts the plan tests run on (per group rank: its host): one host, even hosts, uneven ones
# both ways round, one rank per host, and ranks interleaved over the hosts. The 16-rank ones cost
# more and are used where a test names them.

HOST_LAYOUTS = {
    "1host": [0, 0, 0],
    "2x2": [0, 0, 1, 1],
    "2-1-2": [0, 0, 1, 2, 2],
    "2x1": [0, 1],
    "interleaved": [0, 1, 0, 1],
    "3x2": [0, 0, 1, 1, 2, 2],
    "2-1-3-1": [0, 0, 1, 2, 2, 2, 3],
    "3-1-2-1": [0, 0, 0, 1, 2, 2, 3],
    "8x1": list(range(8)),
    "2x4": [0, 0, 0, 0, 1, 1, 1, 1],
}
BIG_HOST_LAYOUTS = {"4x4": [r // 4 for r in range(16)], "4x4-interleaved": [r % 4 for r in range(16)]}


# ---------------------------------------------------------------------------------------------
# Layouts: the blocks the backend passes for each op (cuda/backend/*.cpp)

ALIASED = ("all_reduce", "reduce", "broadcast")  # one tensor, in place: in[0] is out[0]


def make_blocks(kind: str, world: int, inputs: list, root: int = 0):
    """ins, outs per rank for `inputs` (per rank: a tensor, or a list of tensors for scatter /
    reduce_scatter / all_to_all; None where the rank passes none). In-place ops get a copy of
    the input as their one block; outputs start as garbage (0x5A bytes)."""
    def garbage(like: torch.Tensor) -> torch.Tensor:
        t = torch.empty_like(like)
        if t.numel():
            t.view(torch.uint8).fill_(0x5A if like.dtype != torch.bool else 1)
        return t

    ins, outs = [], []
    for r in range(world):
        x = inputs[r]
        if kind in ALIASED:
            t = x.clone()
            ins.append([t])
            outs.append([t])
        elif kind in ("all_gather", "gather"):
            ins.append([x.clone()])
            outs.append([garbage(x) for _ in range(world)] if kind == "all_gather" or r == root else [None] * world)
        elif kind in ("scatter", "reduce_scatter"):
            if kind == "scatter" and r != root:
                ins.append([None] * world)
                like = inputs[root][r]
            else:
                ins.append([t.clone() for t in x])
                like = x[r]
            outs.append([garbage(like)])
        elif kind == "all_to_all":
            ins.append([t.clone() for t in x])
            outs.append([garbage(inputs[s][r]) for s in range(world)])
        elif kind == "barrier":
            ins.append([])
            outs.append([])
        else:
            raise ValueError(f"no layout for {kind!r}")
    return ins, outs


def run_layout(request: dict, host_of: list[int] | None, inputs: list, *, dtype: torch.dtype | None = None,
               op: str = "sum", factor: float = 2.5, order: str = "round_robin", seed: int = 0,
               slot_bytes: int | None = None, sim: Simulator | None = None, publish_first: bool | None = None):
    """Builds every rank's plan of `request` (PlanRequest fields without rank; world is
    len(inputs); host_of, when given, goes into the request) with the real builders, lays out the
    blocks as the backend does, runs them, and returns (outs, plans, stats): outs[r] is rank r's
    list of Out blocks (typed tensors; for in-place ops the one tensor).
    publish_first: run a barrier plan first and build the data plan with addresses_published
    (what the backend does for all_reduce past the direct-read limit); default: when
    request["addresses_published"] is set."""
    world = len(inputs)
    req = dict(request, world=world)
    if host_of is not None:
        req["host_of"] = list(host_of)
    kind = req["kind"]
    root = req.get("root", 0)
    if dtype is None:
        first = next(x for x in inputs if x is not None)
        dtype = (first if isinstance(first, torch.Tensor) else next(t for t in first if t is not None)).dtype
    plans = build_plans(req)
    if publish_first is None:
        publish_first = bool(req.get("addresses_published"))
    if publish_first:
        barrier = build_plans({"kind": "barrier", "world": world, **({"host_of": req["host_of"]} if "host_of" in req
                                                                    else {})})
        plans = [[b, p] for b, p in zip(barrier, plans)]
    ins, outs = make_blocks(kind, world, inputs, root)
    if sim is None:
        sim = Simulator(world, slot_bytes if slot_bytes is not None else req.get("slot_bytes", 0), host_of)
    stats = sim.run(plans, ins, outs, dtype=dtype, op=op, factor=factor, order=order, seed=seed)
    return outs, plans, stats


def expected_outputs(kind: str, inputs: list, op: str = "sum", root: int = 0) -> list:
    """What every rank's Out blocks must hold (None: unspecified), from the references of
    tests/collective_checks.py."""
    from collective_checks import reference_reduce

    world = len(inputs)
    if kind == "all_reduce":
        ref = reference_reduce(inputs, op, world)
        return [[ref] for _ in range(world)]
    if kind == "reduce":
        ref = reference_reduce(inputs, op, world)
        return [[ref] if r == root else None for r in range(world)]
    if kind == "broadcast":
        return [[inputs[root]] for _ in range(world)]
    if kind == "all_gather":
        return [list(inputs) for _ in range(world)]
    if kind == "gather":
        return [list(inputs) if r == root else None for r in range(world)]
    if kind == "scatter":
        return [[inputs[root][r]] for r in range(world)]
    if kind == "reduce_scatter":
        return [[reference_reduce([inputs[s][r] for s in range(world)], op, world)] for r in range(world)]
    if kind == "all_to_all":
        return [[inputs[s][r] for s in range(world)] for r in range(world)]
    raise ValueError(kind)
