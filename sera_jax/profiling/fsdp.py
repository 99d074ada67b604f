"""FSDP's minimum collective traffic for one optimizer step, to hold a compiled step's inventory against.

Per micro-batch, fully sharded data parallelism within a host (``fsdp`` devices) and plain data parallelism across
hosts (``data``; hybrid sharding) must at least:

* all-gather every parameter in the compute dtype for the forward, and again for the backward (ZeRO-3 frees the
  gathered copy after use; with remat the backward recomputes the forward from it): ``2 · P · (f − 1)/f``;
* reduce-scatter every gradient within the host: ``P · (f − 1)/f``;
* all-reduce each device's ``1/f`` gradient shard across hosts: ``2 · (P/f) · (d − 1)/d``.

``P`` is the parameter bytes in the compute dtype (gradients are reduced in it too), per device figures as in
``profiling.hlo`` (ring algorithms, what each device sends). A program may move less where it reuses a gathered
parameter (the tied embedding is gathered once for the head), and more where it also moves activations (e.g. the
embedding lookup's gradient).
"""

from __future__ import annotations


def fsdp_minimum(num_params: int, *, fsdp: int, data: int, micro: int, compute_itemsize: int = 2
                 ) -> dict[str, dict[str, float]]:
    """Returns {kind: {"within": bytes, "across": bytes}} per device for ``micro`` micro-batches (see module)."""
    p = float(num_params) * compute_itemsize
    out = {k: {"within": 0.0, "across": 0.0} for k in ("all-gather", "reduce-scatter", "all-reduce")}
    if fsdp > 1:
        out["all-gather"]["within"] = micro * 2 * p * (fsdp - 1) / fsdp
        out["reduce-scatter"]["within"] = micro * p * (fsdp - 1) / fsdp
    if data > 1:
        out["all-reduce"]["across"] = micro * 2 * (p / fsdp) * (data - 1) / data
    return out


def total(inv: dict[str, dict[str, float]]) -> float:
    """Returns the sum of within- and across-host bytes of an inventory."""
    return sum(v.get("within", 0.0) + v.get("across", 0.0) for v in inv.values())
