"""Error budgets of the fast paths against exact references: the one table tests read.

Measure: relative Frobenius error ||y - ref|| / ||ref||, ref in float64 from `dequantize()`.
Each budget is a few units of the output dtype's rounding (2**-11 for fp16, 2**-8 for bf16, relative),
because the kernels round twice at most: the dequantized weight when it is cast to the activation
dtype for the tensor cores (only when scales are applied per element), and the output.
"""

import torch

GEMM_REL_ERR = {
    # activation/output dtype: budget
    torch.float16: 4 * 2.0**-11,  # 2.0e-3
    torch.bfloat16: 4 * 2.0**-8,  # 1.6e-2
}


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())
