"""Run cache-dit's `generate` CLI with this plugin's registrations loaded.

    python -m integrate_flux flux --cache --save-path out.png
    torchrun --nproc_per_node=2 -m integrate_flux flux --parallel ulysses
"""

from cache_dit._utils import entrypoint

import integrate_flux  # noqa: F401  (importing it registers the adapter, planners and example)

if __name__ == "__main__":
    entrypoint()
