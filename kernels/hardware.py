"""The GPU the kernels and the compile report are built for: an H100 SXM 80GB (Hopper, 9.0),
figures as XLA's ``gpu_specs/h100_sxm`` gives them. Pure Python (no JAX)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU's facts."""

    device_kind: str  # as JAX reports it
    compute_capability: tuple[int, int]
    sms: int  # streaming multiprocessors
    clock_ghz: float
    fpus_per_sm: int  # f32 CUDA cores per SM
    threads_per_warp: int
    threads_per_block: int
    threads_per_sm: int
    registers_per_sm: int
    registers_per_block: int
    registers_per_thread: int  # ptxas' limit
    smem_per_block: int  # shared memory a block gets without opting in
    smem_per_block_optin: int  # the most shared memory a block may opt in to
    smem_per_sm: int
    smem_alignment: int  # Mosaic GPU's scratch alignment
    l2_bytes: int
    hbm_bytes: int
    hbm_bytes_per_s: int


H100 = Gpu(
    device_kind="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    sms=132,
    clock_ghz=1.98,
    fpus_per_sm=128,
    threads_per_warp=32,
    threads_per_block=1024,
    threads_per_sm=2048,
    registers_per_sm=65536,
    registers_per_block=65536,
    registers_per_thread=255,
    smem_per_block=49152,
    smem_per_block_optin=232_448,  # 227 KiB
    smem_per_sm=233_472,
    smem_alignment=1024,
    l2_bytes=52_428_800,  # 50 MiB
    hbm_bytes=84_978_434_048,
    hbm_bytes_per_s=3_352_320_000_000,
)
