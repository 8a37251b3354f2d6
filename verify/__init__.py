"""verify: the CPU proofs of a generated integration (`run.Verifier`), the GPU matrix (`gpu.py`) and the
output metrics (`metrics.py`). The proofs live in `proofs/`, one module each; model code runs only in
`_worker.py` subprocesses."""
