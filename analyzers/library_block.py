"""A block list whose class another, installed library defines (Latte's `transformer_blocks` of diffusers'
`BasicTransformerBlock`): a transformer block, or a layer.

The class is read from the library's source (found on disk, never imported: `Workspace.follow`), and its
constructor's modules are read as the transformer's own are (`modules.module_tree`). It is a transformer block
when it builds an attention module (`attention.is_attention`: it runs a processor, or its class says it attends)
and a feed-forward beside it (a module with at least two projections under it, or two projections of its own);
a Linear, a convolution, a norm or an embedder builds no attention, and stays a library module.
"""

from __future__ import annotations

import libcst as cst

from integrate.records import Evidence
from integrate.resolve import External, Resolved, Workspace

from .attention import is_attention
from .modules import module_tree


def library_block(ws: Workspace, ext: External) -> tuple[Resolved | None, Evidence | None]:
    """(the class, why it is a transformer block) for a block class `ext` an installed library defines; (None,
    why it is not one) when its source reads as a layer; (None, None) when its source cannot be read (it stays
    what the list's verdict says of library modules)."""
    found = ws.follow(ext)
    if not (isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef)):
        return None, None
    src, cls = found.src, found.node
    tree = module_tree(ws, src, cls)
    children = tree.children("")
    attention = [n for n in children if is_attention(ws, n)]
    own = [n for n in children if n.kind == "linear"]
    ff = [n for n in children if n not in attention and len(tree.linears(n.path)) >= 2]
    ff = ff or (own if len(own) >= 2 else [])
    where, line = str(src.path), src.line(cls)
    name = f"`{cls.name.value}` ({ext.qualname}, read from the installed library's source)"
    if not attention or not ff:
        lacks = "no attention module" if not attention else "no feed-forward beside its attention"
        return None, Evidence(where, line, f"{name} builds {lacks}: a layer, not a transformer block")
    names = ", ".join(f"`{n.path}`" for n in attention)
    return found, Evidence(where, line, f"{name} builds attention ({names}) and a feed-forward "
                                        f"({', '.join(f'`{n.path}`' for n in ff)}): a transformer block")
