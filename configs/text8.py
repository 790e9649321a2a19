"""text8 character-level language modelling, the RHN paper's recipe (Zilly et al. 2017).

    python train.py --config=configs/text8.py --workdir=workdirs/text8

The recipe: ``configs/hutter.py``.
"""

from rhhjax.configs import hutter

VARIANTS, get_config = hutter.config_file("text8")
