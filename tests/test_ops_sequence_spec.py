"""The plain types of a recurrence call (rhhjax/ops/sequence_spec.py): a hashable spec whose
reason does not count, and the facts an implementation judges a model by."""

import dataclasses

import jax.numpy as jnp
import pytest

from rhhjax.ops.sequence_spec import SCAN, ModelFacts, SequenceSpec


def test_spec_is_hashable_frozen_and_ignores_its_reason():
    a = SequenceSpec("fused", 0.7, jnp.float32, reason="requested")
    b = SequenceSpec("fused", 0.7, jnp.float32, reason="auto")
    assert a == b and hash(a) == hash(b) and not a.is_scan
    assert SequenceSpec(SCAN, 1.0, jnp.float32).is_scan
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.impl = "mosaic"
    assert dataclasses.replace(a, first_step=1) != a


def test_model_facts_defaults_are_the_paper_hyperrhn_without_dropout():
    facts = ModelFacts("hyperrhn")
    assert (facts.hyper_input, facts.dropout, facts.hyper_rank) == ("x", "none", 0)
