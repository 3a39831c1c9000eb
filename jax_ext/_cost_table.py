"""The constants of implementation "auto"'s cost model (_auto.py), in one place.

Written by ``jax-ext-bench --calibrate --table jax_ext/_cost_table.py`` (it times the
kernels and XLA's loops on a grid of standalone calls and fits these by least squares);
re-fit on another machine with that one command. Times in seconds; a cost is
``s0 + s_per_row * rows + s_per_byte * bytes (+ ...)`` per call site, see _auto.py.
FITTED_ON says, per constant, which timed cases it was fitted on.
"""
from __future__ import annotations

MACHINE = 'Intel(R) Xeon(R) Processor x2, jax 0.10.2, load average 1.1 when fitted'

# Structural, not fitted: XLA:CPU splits a loop over its thread pool from about this
# many result bytes (below, one thread: the "single" regime), and glibc maps a block of
# at least its dynamic mmap threshold's ceiling (32 MiB on 64-bit) fresh on every call.
POOL_MIN_BYTES = 4096
MMAP_THRESHOLD_BYTES = 32 << 20
# The row lengths (elements of the result's last dim) at which XLA's gather loop
# is timed against the kernel's (gather.lax.row_ratio.*).
ROW_LENGTHS = (8, 16, 32, 48, 64, 74, 75, 96, 128, 256, 512)
# Policy, not fitted: the kernel runs only where estimated this much cheaper; within
# the fit's noise the lax path (which fuses like the jnp code) is kept.
NATIVE_MARGIN = 0.95

TABLE: dict[str, float] = {
    # lax select f32, results under 4096 B
    'select.lax.s0_single': 6.697e-06,
    # lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)
    'select.lax.s0': 2.736e-05,
    # lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per byte read +
    # written
    'select.lax.s_per_byte': 5.039e-11,
    # native select f32, results under 4096 B
    'select.native.s0_single': 6.713e-06,
    # native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)
    'select.native.s0': 4.710e-06,
    # native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per byte read +
    # written
    'select.native.s_per_byte': 3.185e-11,
    # lax row gather f32 on arguments, the shapes of under 300 KB moved: time beyond the kernel's
    # loop
    'gather.lax.s0': 6.441e-05,
    # lax over native row gather, rows of 8 f32 elements, about 4 MiB of result, fixed costs taken
    # off
    'gather.lax.row_ratio.8': 7.154e-01,
    # lax over native row gather, rows of 16 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.16': 1.573e+00,
    # lax over native row gather, rows of 32 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.32': 2.490e+00,
    # lax over native row gather, rows of 48 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.48': 1.528e+00,
    # lax over native row gather, rows of 64 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.64': 2.746e+00,
    # lax over native row gather, rows of 74 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.74': 1.605e+00,
    # lax over native row gather, rows of 75 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.75': 1.297e+00,
    # lax over native row gather, rows of 96 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.96': 7.907e-01,
    # lax over native row gather, rows of 128 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.128': 8.721e-01,
    # lax over native row gather, rows of 256 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.256': 1.423e+00,
    # lax over native row gather, rows of 512 f32 elements, about 4 MiB of result, fixed costs
    # taken off
    'gather.lax.row_ratio.512': 1.479e+00,
    # native row gather f32 on arguments, 12 shapes (rows x row bytes)
    'gather.native.s0': 7.881e-06,
    # native row gather f32 on arguments, 12 shapes (rows x row bytes)
    'gather.native.s_per_row': 2.198e-09,
    # native row gather f32 on arguments, 12 shapes (rows x row bytes)
    'gather.native.s_per_byte': 3.978e-11,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s0': 7.532e-06,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_row': 1.131e-08,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_ct_byte': 3.481e-11,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_out_byte': 7.154e-11,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s0': 7.836e-06,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_row': 1.836e-08,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_ct_byte': 3.182e-11,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_out_byte': 3.833e-11,
    # lax select of a 36 MiB result (a fresh mapping per call), over the same call on reused heap
    # memory, per result byte
    'fresh.lax.s_per_byte': 1.333e-10,
    # native select of a 36 MiB result (a fresh mapping per call), over the same call on reused
    # heap memory, per result byte
    'fresh.native.s_per_byte': 1.217e-10,
    # x * 2 f32 (one fused loop), 2^12-2^22 elements: intercept
    'materialize.s0': 6.558e-06,
    # x * 2 f32, same sizes: per byte read or written
    'materialize.s_per_byte': 4.539e-11,
}

# The same, for code and tests.
FITTED_ON: dict[str, str] = {
    'select.lax.s0_single':
        'lax select f32, results under 4096 B',
    'select.lax.s0':
        'lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)',
    'select.lax.s_per_byte':
        'lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per '
        'byte read + written',
    'select.native.s0_single':
        'native select f32, results under 4096 B',
    'select.native.s0':
        'native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)',
    'select.native.s_per_byte':
        'native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per '
        'byte read + written',
    'gather.lax.s0':
        'lax row gather f32 on arguments, the shapes of under 300 KB moved: time beyond '
        "the kernel's loop",
    'gather.lax.row_ratio.8':
        'lax over native row gather, rows of 8 f32 elements, about 4 MiB of result, fixed'
        ' costs taken off',
    'gather.lax.row_ratio.16':
        'lax over native row gather, rows of 16 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.32':
        'lax over native row gather, rows of 32 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.48':
        'lax over native row gather, rows of 48 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.64':
        'lax over native row gather, rows of 64 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.74':
        'lax over native row gather, rows of 74 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.75':
        'lax over native row gather, rows of 75 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.96':
        'lax over native row gather, rows of 96 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.128':
        'lax over native row gather, rows of 128 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.256':
        'lax over native row gather, rows of 256 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.lax.row_ratio.512':
        'lax over native row gather, rows of 512 f32 elements, about 4 MiB of result, '
        'fixed costs taken off',
    'gather.native.s0':
        'native row gather f32 on arguments, 12 shapes (rows x row bytes)',
    'gather.native.s_per_row':
        'native row gather f32 on arguments, 12 shapes (rows x row bytes)',
    'gather.native.s_per_byte':
        'native row gather f32 on arguments, 12 shapes (rows x row bytes)',
    'scatter_add.lax.s0':
        'lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with'
        ' small cotangents',
    'scatter_add.lax.s_per_row':
        'lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with'
        ' small cotangents',
    'scatter_add.lax.s_per_ct_byte':
        'lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with'
        ' small cotangents',
    'scatter_add.lax.s_per_out_byte':
        'lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with'
        ' small cotangents',
    'scatter_add.native.s0':
        'native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables '
        'with small cotangents',
    'scatter_add.native.s_per_row':
        'native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables '
        'with small cotangents',
    'scatter_add.native.s_per_ct_byte':
        'native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables '
        'with small cotangents',
    'scatter_add.native.s_per_out_byte':
        'native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables '
        'with small cotangents',
    'fresh.lax.s_per_byte':
        'lax select of a 36 MiB result (a fresh mapping per call), over the same call on '
        'reused heap memory, per result byte',
    'fresh.native.s_per_byte':
        'native select of a 36 MiB result (a fresh mapping per call), over the same call '
        'on reused heap memory, per result byte',
    'materialize.s0':
        'x * 2 f32 (one fused loop), 2^12-2^22 elements: intercept',
    'materialize.s_per_byte':
        'x * 2 f32, same sizes: per byte read or written',
}
