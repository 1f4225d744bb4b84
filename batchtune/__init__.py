"""batchtune: measure the batch size, learning rate and generation concurrency that reach a target soonest.

Time-to-target T(B) = R(B) / Θ(B): samples-to-target over end-to-end throughput (see docs/method.md).
"""

__version__ = "0.1.0"
