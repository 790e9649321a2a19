"""`ModelConfig` validation: one-line errors naming the field."""

import pytest

from rhhjax import models


@pytest.mark.parametrize(
    ("field", "value"),
    [("depth", 0), ("keep", 0.0), ("keep", 1.5), ("hidden", -3), ("impl", "cuda"), ("type", "gru")],
)
def test_invalid_config_raises_one_line_error(field, value):
    with pytest.raises(models.ConfigError) as error:
        models.ModelConfig(**{field: value}).validate()
    assert field in str(error.value) and "\n" not in str(error.value)
