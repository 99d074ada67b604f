"""Collectives of an optimised HLO module (``compiled.as_text()``): what each one moves, between which devices, and
how many times a step runs it.

The text is parsed into computations; each computation's execution count is propagated from ``ENTRY`` through the
call graph (a ``while`` body runs its ``known_trip_count`` times, a fusion or call once per caller, each branch of a
``conditional`` once: an upper bound, the branch that computes). Every collective instruction — ``all-gather``,
``reduce-scatter``, ``all-reduce``, ``all-to-all``, ``collective-permute``, synchronous or as an async ``*-start``
(its ``*-done`` is not counted again) — becomes a ``Collective`` with its replica groups resolved to global device
ids, whatever the spelling (explicit ``{{0,1},..}``, iota ``[2,8]<=[16]`` / ``[8,2]<=[2,8]T(1,0)``, or
``mesh[...] {axes}`` with ``device_ids``).

Bytes are per device and per execution, ring-algorithm traffic (what each device sends, and receives):
all-gather ``out·(n−1)/n``, reduce-scatter ``in·(n−1)/n``, all-reduce ``2·in·(n−1)/n``, all-to-all ``in·(n−1)/n``,
collective-permute ``in``. A collective is *cross-host* when one of its groups spans two hosts (``device id //
devices_per_host``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from typing import Iterable

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
# An all-reduce of at least this many elements within a host is weight-sized: FSDP reduce-scatters gradients
# there and all-reduces only their 1/fsdp shards across hosts, so nothing that large should be all-reduced in-host.
WEIGHT_SIZED_ELEMENTS = 1 << 20

_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"([a-z]+[0-9a-z]*)\[([0-9,]*)\]")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str     # the result type text: an array ``bf16[2560,9728]{1,0}`` or a tuple ``(...)``
    opcode: str
    rest: str      # operands and attributes


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program, per device and per execution."""

    kind: str                     # one of KINDS
    name: str
    computation: str
    count: int                    # executions per program run (trip counts of enclosing loops multiplied)
    groups: tuple[tuple[int, ...], ...]
    in_bytes: int                 # per device, all operands
    out_bytes: int                # per device, all results
    largest_elements: int         # elements of its largest single operand
    cross_host: bool

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else 1

    @property
    def traffic_bytes(self) -> float:
        """Bytes each device sends (and receives) per execution, ring algorithms."""
        n = self.group_size
        if n <= 1:
            return 0.0
        frac = (n - 1) / n
        return {"all-gather": self.out_bytes * frac, "reduce-scatter": self.in_bytes * frac,
                "all-reduce": 2 * self.in_bytes * frac, "all-to-all": self.in_bytes * frac,
                "collective-permute": float(self.in_bytes)}[self.kind]

    def weight_sized_in_host(self, devices_per_host: int) -> bool:
        """Returns whether this is an all-reduce of ≥ WEIGHT_SIZED_ELEMENTS elements among devices of one host."""
        if self.kind != "all-reduce" or self.largest_elements < WEIGHT_SIZED_ELEMENTS:
            return False
        return any(len({d // devices_per_host for d in g}) < len(g) for g in self.groups)

    def describe(self) -> str:
        where = "across hosts" if self.cross_host else "within a host"
        return (f"{self.kind} {self.name} x{self.count} in {self.computation}: {self.in_bytes / 2**20:.1f} MiB in, "
                f"{self.out_bytes / 2**20:.1f} MiB out, groups of {self.group_size} {where}")


# ------------------------------------------------------------------------------------------------------ parsing
def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """Returns ({computation name: its instructions}, the ENTRY computation's name) of HLO module text."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h:
            current = h.group(2)
            comps[current] = []
            if h.group(1):
                entry = current
            continue
        if current is None:
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if m:
            shape, after = _split_shape(m.group(2))
            opcode, _, rest = after.partition("(")
            comps[current].append(Instruction(m.group(1), shape, opcode.strip(), rest))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _split_shape(s: str) -> tuple[str, str]:
    """Splits 'TYPE opcode(...)' into (TYPE, 'opcode(...)'), TYPE possibly a parenthesised tuple."""
    s = s.lstrip()
    if not s.startswith("("):
        shape, _, after = s.partition(" ")
        return shape, after
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return s[: i + 1], s[i + 1:].lstrip()
    raise ValueError(f"unbalanced tuple type: {s[:120]}")


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Returns the (dtype, dims) of every array in a result type, in order (tuples flattened)."""
    shape = re.sub(r"/\*.*?\*/", "", shape)
    out = []
    for dt, dims in _ARRAY.findall(shape):
        if dt in DTYPE_BYTES:
            out.append((dt, tuple(int(d) for d in dims.split(",") if d)))
    return out


def _nbytes(arrs: Iterable[tuple[str, tuple[int, ...]]]) -> int:
    return sum(DTYPE_BYTES[dt] * math.prod(dims) for dt, dims in arrs)


def _top_level(shape: str) -> list[str]:
    """Returns the top-level elements of a tuple type (the type itself if it is an array)."""
    shape = re.sub(r"/\*.*?\*/", "", shape).strip()
    if not shape.startswith("("):
        return [shape]
    inner, parts, depth, cur = shape[1:-1], [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


# ------------------------------------------------------------------------------------------------ call graph
def _callees(ins: Instruction) -> list[tuple[str, int | None]]:
    """Returns (computation, trip count or None for once) the instruction runs; reducers (to_apply) excluded."""
    r = ins.rest
    out: list[tuple[str, int | None]] = []
    if ins.opcode == "while":
        trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', r)
        n = int(trip.group(1)) if trip else 1
        for key in ("body", "condition"):
            m = re.search(key + r"=%([\w.\-]+)", r)
            if m:
                out.append((m.group(1), n))
        return out
    for key in ("calls", "true_computation", "false_computation"):
        for m in re.finditer(key + r"=%([\w.\-]+)", r):
            out.append((m.group(1), None))
    m = re.search(r"branch_computations=\{([^}]*)\}", r)
    if m:
        out += [(c.strip().lstrip("%"), None) for c in m.group(1).split(",") if c.strip()]
    m = re.search(r"called_computations=\{([^}]*)\}", r)
    if m:
        out += [(c.strip().lstrip("%"), None) for c in m.group(1).split(",") if c.strip()]
    return out


def execution_counts(comps: dict[str, list[Instruction]], entry: str) -> dict[str, int]:
    """Returns how many times each computation reachable from ``entry`` runs per program run."""
    counts: dict[str, int] = defaultdict(int)
    order, seen = [], set()

    def visit(c):  # topological order (callers before callees) over the call DAG
        if c in seen or c not in comps:
            return
        seen.add(c)
        for ins in comps[c]:
            for callee, _ in _callees(ins):
                visit(callee)
        order.append(c)

    visit(entry)
    counts[entry] = 1
    for c in reversed(order):
        for ins in comps[c]:
            for callee, trip in _callees(ins):
                counts[callee] += counts[c] * (trip or 1)
    return dict(counts)


# ---------------------------------------------------------------------------------------------- replica groups
def _iota(spec: str) -> np.ndarray:
    """Returns the device ids of an iota spec as an array: ``[a,b]<=[c,d]T(1,0)`` (ids 0..n-1 shaped [c,d],
    transposed, reshaped to [a,b]), ``[c,d]T(1,0)`` (shaped [c,d], transposed) or ``[n]``."""
    m = re.fullmatch(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?", spec.strip())
    if not m:
        raise ValueError(f"unrecognised iota spec {spec!r}")
    first = [int(x) for x in m.group(1).split(",")]
    src = [int(x) for x in m.group(2).split(",")] if m.group(2) else first
    ids = np.arange(math.prod(src)).reshape(src)
    if m.group(3):
        ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return ids.reshape(first) if m.group(2) else ids


def replica_groups(rest: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Returns the replica groups (global device ids) of a collective's attribute text."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if m:
        pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(0))
        return tuple((int(a), int(b)) for a, b in pairs)
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*(?:\([^)]*\))?)\))?\s*\{([^}]*)\}", rest)
    if m:
        axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        ids = (_iota(m.group(2)) if m.group(2) else np.arange(math.prod(sizes))).reshape(sizes)
        over = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(3))]
        keep = [i for i in range(len(names)) if i not in over]
        ids = ids.transpose(keep + over).reshape(-1, math.prod(sizes[i] for i in over) if over else 1)
        return tuple(tuple(int(x) for x in g) for g in ids)
    m = re.search(r"replica_groups=(\[[\d,]+\](?:<=\[[\d,]+\](?:T\([\d,]+\))?)?)", rest)
    if m:
        ids = _iota(m.group(1))
        return tuple(tuple(int(x) for x in g) for g in ids.reshape(ids.shape[0], -1))
    m = re.search(r"replica_groups=\{(\{[\d,{} ]*\})\}", rest)
    if m:
        groups = re.findall(r"\{([\d,]+)\}", m.group(1))
        return tuple(tuple(int(x) for x in g.split(",")) for g in groups)
    return (tuple(range(num_devices)),)  # replica_groups={} (or none): every device in one group


# --------------------------------------------------------------------------------------------------- inventory
def collectives(text: str, num_devices: int, devices_per_host: int) -> list[Collective]:
    """Returns every collective of the compiled module ``text`` with its per-run execution count."""
    comps, entry = parse_module(text)
    counts = execution_counts(comps, entry)
    out = []
    for comp, instrs in comps.items():
        n = counts.get(comp, 0)
        if n == 0:
            continue
        for ins in instrs:
            kind = ins.opcode[:-6] if ins.opcode.endswith("-start") else ins.opcode
            if kind not in KINDS:
                continue
            groups = replica_groups(ins.rest, num_devices)
            g = len(groups[0]) if groups else 1
            ins_arrs, outs_arrs = _in_out(ins, kind, g)
            cross = any(len({d // devices_per_host for d in grp}) > 1 for grp in groups)
            largest = max((math.prod(d) for _, d in ins_arrs), default=0)
            out.append(Collective(kind, ins.name, comp, n, groups, _nbytes(ins_arrs), _nbytes(outs_arrs), largest,
                                  cross))
    return out


def _in_out(ins: Instruction, kind: str, group: int):
    """Returns (operand arrays, result arrays) of a collective, per device."""
    parts = _top_level(ins.shape)
    if ins.opcode.endswith("-start") and kind in ("all-gather", "reduce-scatter", "all-to-all",
                                                   "collective-permute") and len(parts) >= 2:
        # Async start: (operands, results[, scratch...]); each side an array or a tuple of arrays.
        return arrays(parts[0]), arrays(parts[1])
    res = arrays(ins.shape)
    if kind == "all-gather":
        return [(dt, _scale_first(d, 1 / group)) for dt, d in res], res
    if kind == "reduce-scatter":
        return [(dt, _scale_first(d, group)) for dt, d in res], res
    return res, res


def _scale_first(dims: tuple[int, ...], f: float) -> tuple[int, ...]:
    # Only the byte count matters: scale the element count, keep a valid shape.
    n = max(1, round(math.prod(dims) * f))
    return (n,)


def inventory(colls: list[Collective]) -> dict[str, dict[str, float]]:
    """Returns per-device traffic bytes per run, {kind: {"within": …, "across": …, "count": executions}}."""
    inv: dict[str, dict[str, float]] = {k: {"within": 0.0, "across": 0.0, "count": 0} for k in KINDS}
    for c in colls:
        inv[c.kind]["across" if c.cross_host else "within"] += c.traffic_bytes * c.count
        inv[c.kind]["count"] += c.count
    return inv


def total_traffic(inv: dict[str, dict[str, float]]) -> tuple[float, float]:
    """Returns (within-host, across-host) per-device bytes of an ``inventory``."""
    return sum(v["within"] for v in inv.values()), sum(v["across"] for v in inv.values())
