"""enwik8 byte-level language modelling (the RHN paper's recipe, Zilly et al. 2017).

Command (reported test BPC 1.27; 46M parameters):

    python train.py --config=configs/enwik8.py --workdir=workdirs/enwik8

The recipe (data, model, training) is ``configs/hutter.py``, shared with the other corpus.
Any field can be overridden: ``--config.train.max_minutes=600 --config.model.depth=5``.
"""

import ml_collections
from rhhjax.configs import check_variant, hutter

VARIANTS = ("",)


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """The RHN paper's enwik8 configuration."""
    check_variant("enwik8", variant, VARIANTS)
    return hutter.recipe("enwik8")
