"""The constants of implementation "auto"'s cost model (_auto.py), in one place.

Written by ``jax-ext-bench --calibrate --table jax_ext/_cost_table.py`` (it times the
kernels and XLA's loops on a grid of standalone calls and fits these by least squares);
re-fit on another machine with that one command. Times in seconds; a cost is
``s0 + s_per_row * rows + s_per_byte * bytes (+ ...)`` per call site, see _auto.py.
FITTED_ON says, per constant, which timed cases it was fitted on.
"""
from __future__ import annotations

MACHINE = 'Intel(R) Xeon(R) Processor x2, jax 0.10.2, load average 0.3 when fitted'

# Structural, not fitted: XLA:CPU splits a loop over its thread pool from about this
# many result bytes (below, one thread: the "single" regime), and glibc maps a block of
# at least its dynamic mmap threshold's ceiling (32 MiB on 64-bit) fresh on every call.
POOL_MIN_BYTES = 4096
MMAP_THRESHOLD_BYTES = 32 << 20
# Policy, not fitted: the kernel runs only where estimated this much cheaper; within
# the fit's noise the lax path (which fuses like the jnp code) is kept.
NATIVE_MARGIN = 0.95

TABLE: dict[str, float] = {
    # lax select f32, results under 4096 B
    'select.lax.s0_single': 4.630e-06,
    # lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)
    'select.lax.s0': 1.098e-05,
    # lax select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per byte read +
    # written
    'select.lax.s_per_byte': 3.295e-11,
    # native select f32, results under 4096 B
    'select.native.s0_single': 4.883e-06,
    # native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool)
    'select.native.s0': 5.365e-06,
    # native select f32 on arguments, 4096 B - 16384 KiB of result (thread pool): per byte read +
    # written
    'select.native.s_per_byte': 2.622e-11,
    # lax row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.lax.s0': 8.190e-06,
    # lax row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.lax.s_per_row': 0.000e+00,
    # lax row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.lax.s_per_byte': 5.770e-11,
    # native row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.native.s0': 4.780e-06,
    # native row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.native.s_per_row': 6.512e-10,
    # native row gather f32 on arguments, 10 shapes (rows x row bytes)
    'gather.native.s_per_byte': 3.845e-11,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s0': 2.652e-06,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_row': 6.457e-09,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_ct_byte': 2.633e-11,
    # lax: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.lax.s_per_out_byte': 6.409e-11,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s0': 1.396e-05,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_row': 1.788e-08,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_ct_byte': 0.000e+00,
    # native: grad of sum(gather(t) * ct) w.r.t. t, the same shapes and 3 big tables with small
    # cotangents
    'scatter_add.native.s_per_out_byte': 5.218e-11,
    # lax select of a 36 MiB result (a fresh mapping per call), over the same call on reused heap
    # memory, per result byte
    'fresh.lax.s_per_byte': 1.355e-10,
    # native select of a 36 MiB result (a fresh mapping per call), over the same call on reused
    # heap memory, per result byte
    'fresh.native.s_per_byte': 9.898e-11,
    # x * 2 f32 (one fused loop), 2^12-2^22 elements: intercept
    'materialize.s0': 3.651e-06,
    # x * 2 f32, same sizes: per byte read or written
    'materialize.s_per_byte': 9.445e-11,
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
        'lax row gather f32 on arguments, 10 shapes (rows x row bytes)',
    'gather.lax.s_per_row':
        'lax row gather f32 on arguments, 10 shapes (rows x row bytes)',
    'gather.lax.s_per_byte':
        'lax row gather f32 on arguments, 10 shapes (rows x row bytes)',
    'gather.native.s0':
        'native row gather f32 on arguments, 10 shapes (rows x row bytes)',
    'gather.native.s_per_row':
        'native row gather f32 on arguments, 10 shapes (rows x row bytes)',
    'gather.native.s_per_byte':
        'native row gather f32 on arguments, 10 shapes (rows x row bytes)',
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
