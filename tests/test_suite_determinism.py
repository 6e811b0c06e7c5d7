"""The suite's own guarantees: each test's random tensors do not depend on what ran before."""

import torch


def test_each_test_draws_from_seed_0():
    # conftest's autouse fixture: torch's default seed, or a generator another test advanced,
    # would draw different numbers
    torch.testing.assert_close(torch.randn(8),
                               torch.randn(8, generator=torch.Generator().manual_seed(0)))
    assert torch.initial_seed() == 0
