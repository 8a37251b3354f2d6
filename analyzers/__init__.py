"""Static analysers (libcst). They read source text and never import the analysed code.

`analysis.analyze(gate, workspace)` turns the gate's five facts into an `Analysis` record (`records.py`):
the transformer's block lists with their ForwardPattern, the findings of the detectors in `rules/`
(call-site pitfalls, walks a wrapper breaks) with their evidence, and the pipeline's CFG style; with
`parallel=True` also what the CP / TP / TE-P / VAE-P decisions read (`structure.parallel_facts`).

The readers, one question each: `blocks.py` (where the ModuleLists are built and what they hold),
`loops.py` (how forward walks them), `binding.py` (call sites bound through cache-dit's wrapper),
`patterns.py` (ForwardPattern), `forward.py` (a block's signature and returns), `cfg.py` (CFG style),
`support.py` (what cache-dit already registers), `modules.py` (the module tree a class builds),
`attention.py`, `sequence.py` (with `sequence_forward.py`, `sequence_walks.py`, `sequence_split.py`),
`structure.py`, `ndim.py`, `encoders.py` (parallelism facts), `values.py` (constant arithmetic, UNKNOWN
when not computable).

This package file imports nothing: reading a record type (`integrate.analyzers.records`) must not load
every reader.
"""
