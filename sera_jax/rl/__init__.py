"""Credit assignment: pure functions from tree records to advantaged, packed training batches (docs/design/algorithm.md §2, §5–§8).

datums (trees → sequences per objective) · launch_spans (launch-statement masks) · rewards · baselines (LOO,
depth weights, per-task-group verdicts) · batch (packed fixed-shape micro-batches) · losses (CISPO, PG) · stages.
Import the submodules directly; this package imports nothing so that importing one stays cheap.
"""
