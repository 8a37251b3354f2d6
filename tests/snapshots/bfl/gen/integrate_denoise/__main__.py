"""Run cache-dit's `generate` CLI with this plugin's registrations loaded.

    python -P -m integrate_denoise denoise --cache --save-path out.png
    PYTHONSAFEPATH=1 torchrun --nproc_per_node=2 -m integrate_denoise denoise --parallel ulysses

-P and PYTHONSAFEPATH=1 keep the working directory off sys.path: a cache_dit.py there would be imported in place of
the real package. Put the folder holding this package on PYTHONPATH.
"""

from cache_dit._utils import entrypoint

import integrate_denoise  # noqa: F401  (importing it registers the adapter, planners and example)

if __name__ == "__main__":
    entrypoint()
