"""The names of the CPU kernel variants of ``specc.kernels.qgemm`` (``qgemm.c``), torch-free so that cost
tables and plans can be checked against them without loading the kernels.
"""
from __future__ import annotations

#: index = the C variant number
VARIANTS = ("portable", "avx2", "avx512", "avx512vnni", "avx2int8")
#: the default variant is the first of these the CPU runs: int8 activations before fp32 ones (a one-row
#: product is bound by the weight bytes, and the int8 dot products are the cheaper arithmetic per byte)
PREFERENCE = ("avx512vnni", "avx2int8", "avx512", "avx2", "portable")
#: the variants whose q4 / Q8_0 products run on the packed layout with int8 activations
PACKED_VARIANTS = ("avx512vnni", "avx2int8")

#: ``$SPECC_QGEMM_ISA``: run only the variants a CPU with this instruction set runs (as ``qgemm_limit``
#: takes them) and every choice made from them (the attention, variant 4's fp32 parts), so one machine
#: measures another's kernels; unset: every path this CPU runs. Not covered: the three routines the
#: compiler clones per instruction set (RMSNorm, the activations' int8 quantization, the generic
#: attention), which pick this CPU's best clone at load (``portable`` therefore still runs AVX2 clones)
ISA_CEILINGS = {"avx2": ("portable", "avx2", "avx2int8"), "portable": ("portable",)}
