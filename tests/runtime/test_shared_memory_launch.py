"""A kernel's static and dynamic shared memory together decide whether it must opt in to more
than 48 KiB before its launch. Deciding on the dynamic bytes alone launched nvFuser's
test_issue1310 (an inner-outer kernel with 48 KiB dynamic beside its static barriers and group
scratch) without the opt-in: CUDA_ERROR_INVALID_VALUE."""

from __future__ import annotations

import pytest
import torch

from fusecut import DataType, FusionDefinition
from fusecut.runtime.kernels import DEFAULT_SMEM, needs_smem_opt_in


def test_the_opt_in_counts_static_shared_memory_too():
    assert needs_smem_opt_in(2560, DEFAULT_SMEM)
    assert needs_smem_opt_in(0, DEFAULT_SMEM + 16)
    assert not needs_smem_opt_in(0, DEFAULT_SMEM)
    assert not needs_smem_opt_in(1024, DEFAULT_SMEM - 1024)
    assert not needs_smem_opt_in(DEFAULT_SMEM, 0)  # static alone: the compiler's limit


@pytest.mark.gpu
def test_issue1310_inner_outer_with_static_and_48k_dynamic_shared_memory_launches():
    x = torch.randn((16, 128, 768), dtype=torch.bfloat16, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16)
        t1 = fd.ops.cast(t0, DataType.Float)
        t2 = fd.ops.cast(t0, DataType.Float)
        fd.add_output(fd.ops.sum(t2, dims=[0, 1]))
        fd.add_output(fd.ops.sum(t1, dims=[0, 1]))
        fd.add_output(fd.ops.sum(t1, dims=[2]))
    a, b, c = fd.execute([x])
    xf = x.float()
    torch.testing.assert_close(a, xf.sum([0, 1]))
    torch.testing.assert_close(b, xf.sum([0, 1]))
    torch.testing.assert_close(c, xf.sum([2]))
