"""``DataError`` and the argument checks of the data modules (rhhjax/data/errors.py)."""

import numpy as np
import pytest

from rhhjax.data.errors import DataError, check_int, check_tokens
from rhhjax.errors import UserError


def test_data_error_is_a_one_line_user_error():
    error = DataError("the file\nis empty")
    assert isinstance(error, UserError) and str(error) == "the file is empty"


def test_check_int_takes_integers_at_or_above_the_minimum():
    assert check_int("data.unk", np.int64(3), 0) == 3 and type(check_int("n", 3, 0)) is int
    for bad in (True, 2.0, "3", -1):
        with pytest.raises(DataError, match="n must be an integer >= 0"):
            check_int("n", bad, 0)


def test_check_tokens_takes_one_dimensional_integers():
    np.testing.assert_array_equal(check_tokens([1, 2, 3]), [1, 2, 3])
    for bad in (np.zeros((2, 2), np.int32), np.zeros(3, np.float32)):
        with pytest.raises(DataError, match="1-D integer array"):
            check_tokens(bad)
