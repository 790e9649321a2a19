"""What the installed project provides: the kernels and configs under the rhhjax namespace, and
no top-level module named ``kernels`` (a PyPI package of that name exists)."""

import json
import os
import subprocess
import sys

PROBE = """
import importlib.util, json
import rhhjax.kernels.highway, rhhjax.configs.ptb
print(json.dumps({
    "kernels_top_level": importlib.util.find_spec("kernels") is not None,
    "configs_top_level": importlib.util.find_spec("configs") is not None,
    "highway": rhhjax.kernels.highway.__name__,
    "ptb_variants": list(rhhjax.configs.ptb.VARIANTS),
}))
"""


def test_installed_namespace_has_kernels_and_configs_and_no_top_level_kernels(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # run outside the checkout, so only what is installed can be imported
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(out.stdout)
    assert found == {
        "kernels_top_level": False,
        "configs_top_level": False,
        "highway": "rhhjax.kernels.highway",
        "ptb_variants": ["", "rhn", "lstm", "cpu", "tiny"],
    }
