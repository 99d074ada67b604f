"""profiling.hlo: collectives read from optimised HLO text — replica groups in every spelling, execution counts
through loops, per-device traffic, host attribution; checked on hand-written modules and on XLA's own output."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax.profiling import hlo


@pytest.mark.parametrize("text, groups", [
    ("replica_groups={{0,1},{2,3}}, to_apply=%add", ((0, 1), (2, 3))),
    ("replica_groups=[2,8]<=[16], dimensions={0}", (tuple(range(8)), tuple(range(8, 16)))),
    ("replica_groups=[8,2]<=[2,8]T(1,0), use_global_device_ids=true", tuple((i, i + 8) for i in range(8))),
    # mesh spelling: devices laid [2,8] transposed onto a (8,1,2) mesh; groups along axis_0 are the two hosts' 8
    ("replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}, dims",
     (tuple(range(8)), tuple(range(8, 16)))),
    ("replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_2'}, x",
     tuple((i, i + 8) for i in range(8))),
    ("replica_groups=mesh['axis_0'=16,'axis_1'=1] {'axis_0'}, use_global_device_ids=true", (tuple(range(16)),)),
    ("replica_groups={}, to_apply=%add", (tuple(range(16)),)),
    ("source_target_pairs={{0,1},{1,2}}, channel_id=3", ((0, 1), (1, 2))),
])
def test_replica_groups_in_every_spelling(text, groups):
    assert hlo.replica_groups(text, 16) == groups


MODULE = """HloModule m, entry_computation_layout={()->()}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  %g = bf16[8,32]{1,0} get-tuple-element(%p), index=1
  %ag = (bf16[8,32]{1,0}, bf16[64,32]{1,0}) all-gather-start(%g), channel_id=1, replica_groups=[2,8]<=[16], dimensions={0}, use_global_device_ids=true
  %agd = bf16[64,32]{1,0} all-gather-done(%ag)
  %rs = ((bf16[64,32]{1,0}), (bf16[8,32]{1,0})) reduce-scatter-start(%agd), channel_id=2, replica_groups=[2,8]<=[16], dimensions={0}, to_apply=%add
  ROOT %t = (s32[], bf16[64,32]{1,0}) tuple(%i, %agd)
}

%cond (p: (s32[], bf16[64,32])) -> pred[] {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

%branch (x: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  ROOT %ar = f32[1024,1024]{1,0} all-reduce(%x), channel_id=3, replica_groups=[8,2]<=[2,8]T(1,0), to_apply=%add
}

ENTRY %main () -> () {
  %init = (s32[], bf16[64,32]{1,0}) tuple()
  %w = (s32[], bf16[64,32]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"36"},"known_init_step":{"init":"0","step":"1"}}
  %k = f32[1024,1024]{1,0} conditional(%p0, %x0, %x1), true_computation=%branch, false_computation=%cond
  ROOT %r = () tuple()
}
"""


def test_counts_traffic_and_hosts_of_a_module():
    comps, entry = hlo.parse_module(MODULE)
    assert entry == "main" and set(comps) == {"add", "body", "cond", "branch", "main"}
    counts = hlo.execution_counts(comps, entry)
    assert counts["body"] == 36 and counts["branch"] == 1 and counts["main"] == 1
    by_kind = {c.kind: c for c in hlo.collectives(MODULE, 16, 8)}
    assert set(by_kind) == {"all-gather", "reduce-scatter", "all-reduce"}  # -done ops are not counted again
    ag, rs, ar = by_kind["all-gather"], by_kind["reduce-scatter"], by_kind["all-reduce"]
    assert (ag.count, ag.in_bytes, ag.out_bytes, ag.group_size, ag.cross_host) == (36, 8 * 32 * 2, 64 * 32 * 2, 8, False)
    assert ag.traffic_bytes == 64 * 32 * 2 * 7 / 8
    assert (rs.in_bytes, rs.out_bytes) == (64 * 32 * 2, 8 * 32 * 2) and rs.traffic_bytes == 64 * 32 * 2 * 7 / 8
    assert ar.cross_host and ar.group_size == 2 and ar.traffic_bytes == 2 * 1024 * 1024 * 4 / 2
    assert not ar.weight_sized_in_host(8)  # groups {i, i+8}: one device per host
    inv = hlo.inventory(hlo.collectives(MODULE, 16, 8))
    assert inv["all-gather"]["within"] == 36 * ag.traffic_bytes and inv["all-reduce"]["across"] == ar.traffic_bytes
    assert hlo.total_traffic(inv) == (36 * (ag.traffic_bytes + rs.traffic_bytes), ar.traffic_bytes)


def test_weight_sized_in_host_all_reduce_is_flagged():
    text = MODULE.replace("replica_groups=[8,2]<=[2,8]T(1,0), to_apply", "replica_groups=[2,8]<=[16], to_apply")
    (ar,) = [c for c in hlo.collectives(text, 16, 8) if c.kind == "all-reduce"]
    assert ar.weight_sized_in_host(8) and not ar.cross_host


def test_xla_cpu_output_of_a_psum_in_a_scan():
    """The parser on XLA's own text: a psum over 4 of 8 devices inside a 5-step scan is one all-reduce run 5
    times over groups {0..3}, {4..7} (a 'host' of 4)."""
    devices = np.array(jax.devices()[:8]).reshape(2, 4)
    mesh = Mesh(devices, ("h", "d"))

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("h", "d"), out_specs=P("h", "d"), check_vma=False)
    def f(x):
        def body(c, _):
            return jax.lax.psum(c * 1.5, "d"), None
        return jax.lax.scan(body, x, None, length=5)[0]

    x = jax.device_put(jnp.ones((2, 4 * 1024)), NamedSharding(mesh, P("h", "d")))
    text = jax.jit(f).lower(x).compile().as_text()
    ars = [c for c in hlo.collectives(text, 8, 4) if c.kind == "all-reduce"]
    assert sum(c.count for c in ars) == 5
    assert all(set(c.groups) == {(0, 1, 2, 3), (4, 5, 6, 7)} and not c.cross_host for c in ars)
    assert all(c.in_bytes == 1024 * 4 for c in ars)
