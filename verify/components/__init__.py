"""The component proofs' worker side: a pipeline part other than the transformer (a text encoder, a VAE) built tiny
from its config, run once as one process, then through its cache-dit planner across the gloo processes of the job,
and compared. `tep.py` and `vaep.py` are one proof each; `common.py` is what they share. These modules import torch
and run in `integrate.verify._worker` (mode "component"), never in the CLI's process.

Every rank computes the 1-process reference itself before the planner is applied (the same seeded weights, broadcast
from rank 0, and the same inputs on every rank), so a proof needs one set of processes, and the reference is exactly
the plain module's run.
"""
