"""text8 character-level language modelling (the RHN paper's recipe, Zilly et al. 2017).

Command (reported test BPC 1.27; 45M parameters):

    python train.py --config=configs/text8.py --workdir=workdirs/text8

The recipe (data, model, training) is ``configs/hutter.py``, shared with the other corpus.
Any field can be overridden: ``--config.train.max_minutes=600 --config.model.depth=5``.
"""

import ml_collections
from rhhjax.configs import check_variant, hutter

VARIANTS = ("",)


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """The RHN paper's text8 configuration."""
    check_variant("text8", variant, VARIANTS)
    return hutter.recipe("text8")
