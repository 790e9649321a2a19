"""text8 character-level language modelling (the RHN paper's recipe, Zilly et al. 2017).

Command (reported test BPC 1.27; 45M parameters):

    python train.py --config=configs/text8.py --workdir=workdirs/text8

The recipe is ``configs/hutter.py``; override any field: ``--config.model.depth=5``.
"""

from rhhjax.configs import hutter

VARIANTS, get_config = hutter.config_file("text8")
