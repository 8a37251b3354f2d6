"""Ground truth from cache-dit's own registry, not from a table written here.

Each registered adapter function is called with a stand-in pipeline whose transformer
records attribute names, so the adapter reports which block lists it wraps, with which
ForwardPattern, and whether it declares separate CFG.
"""

from __future__ import annotations

import os

os.environ.setdefault("CACHE_DIT_FLUX_ENABLE_DUMMY_BLOCKS", "0")


class _Attr:
    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, key: str) -> _Attr:
        return _Attr(f"{self.name}.{key}")

    def __add__(self, other: _Attr) -> _Attr:
        return _Attr(f"{self.name}+{other.name}")

    def __repr__(self) -> str:
        return self.name


def _transformer(class_name: str):
    cls = type(class_name, (), {"__getattr__": lambda self, key: _Attr(key), "__module__": "oracle_stub"})
    return cls()


class _Pipe:
    def __init__(self, pipeline_class: str, transformer_class: str) -> None:
        self.transformer = _transformer(transformer_class)
        self.__class__ = type(pipeline_class, (_Pipe,), {})


def cache_dit_answer(pipeline_class: str, transformer_class: str) -> dict | None:
    from cache_dit.caching.block_adapters import BlockAdapterRegister

    for prefix, factory in BlockAdapterRegister._adapters.items():
        if pipeline_class.startswith(prefix):
            adapter = factory(_Pipe(pipeline_class, transformer_class), skip_post_init=True)
            blocks = adapter.blocks if isinstance(adapter.blocks, list) else [adapter.blocks]
            patterns = adapter.forward_pattern
            patterns = patterns if isinstance(patterns, list) else [patterns] * len(blocks)
            return {
                "prefix": prefix,
                "blocks": [repr(b) for b in blocks],
                "patterns": [p.name for p in patterns],
                # the registry's own rule: the adapter's flag, or a prefix in its CFG list
                "has_separate_cfg": bool(adapter.has_separate_cfg) or any(
                    pipeline_class.startswith(n) for n in BlockAdapterRegister._predefined_adapters_has_separate_cfg
                ),
                "patch_functor": type(adapter.patch_functor).__name__ if adapter.patch_functor else None,
                "check_forward_pattern": adapter.check_forward_pattern,
            }
    return None
