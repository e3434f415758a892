"""Reference implementations, the definitions written plainly (quadratic; for tests on small traces)."""

from __future__ import annotations

from ablations.workload.trace import Trace, shared_prefix_blocks


def served_blocks(trace: Trace) -> list[int]:
    """Per request (trace order): leading blocks an unbounded cache holding every earlier prompt serves.

    "Earlier" is arrival order (timestamp, file order on ties); a block is served when it and every
    block before it match some earlier prompt's blocks: the longest shared prefix with any earlier prompt.
    """
    order = trace.arrival_order()
    served = [0] * len(trace.requests)
    for position, index in enumerate(order):
        hash_ids = trace.requests[index].hash_ids
        served[index] = max((shared_prefix_blocks(hash_ids, trace.requests[j].hash_ids)
                             for j in order[:position]), default=0)
    return served
