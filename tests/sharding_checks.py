"""The multi-device checks of test_sharding.py, run in a child process that was started
with XLA_FLAGS=--xla_force_host_platform_device_count=N (jax fixes the device count when
its backends start, so the rest of the suite keeps one device).

    python tests/sharding_checks.py run OUTDIR     # N=4: the native checks, the exports
                                                   # (OUTDIR/*.bin) and the matrix;
                                                   # OUTDIR/results.json
    python tests/sharding_checks.py load OUTDIR    # N=4, a fresh process: deserialize, call
    python tests/sharding_checks.py matrix OUTDIR  # any N: the matrix only; OUTDIR/matrix.json
    python tests/sharding_checks.py matrix OUTDIR nox64  # the same with jax_enable_x64 off

Each check records {ok, error, collectives, targets, spec} under its name. "collectives"
and "targets" come from the compiled HLO (jit(f).lower(...).compile().as_text()).

The matrix runs every check under "native", "lax" and "auto", on three kinds of mesh
(KINDS): an auto-axes mesh (``Mesh(...)``), an explicit-axes one under ``jax.set_mesh``,
and ``jax.make_mesh``'s default (explicit) axes with no mesh set, as a user who only places
arrays has them: batch-, row- and index-sharded operands, evenly and unevenly (lengths the
mesh does not divide); forward, grad and vmap. Each compares with numpy bit for bit; where
a check says so, its compiled program holds no collective, or none that the same program
written with jnp does not hold too.
"""
import contextlib
import json
import os
import re
import sys

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# gather's offsets and counts are int64 with x64 on; "nox64" runs the matrix without it.
X64 = "nox64" not in sys.argv[3:]
jax.config.update("jax_enable_x64", X64)

import jax_ext  # noqa: E402  (registers the FFI targets)
import ml_dtypes  # noqa: E402
from jax_ext import _compat_sharding  # noqa: E402
from jax_ext.auto import explain as _explain  # noqa: E402
from references import SUB_BYTE_DTYPES, random_values, recorder  # noqa: E402

COLL = re.compile(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
                  r"(?:-start)?\(")
TARGET = re.compile(r'custom_call_target="([^"]+)"')
RESULTS = {}


def compiled_info(f, *args):
    text = f.lower(*args).compile().as_text()
    return sorted(set(COLL.findall(text))), sorted(set(TARGET.findall(text))), text


check = recorder(RESULTS)


def same_bits(got, want):
    if isinstance(got, jax.Array) and not got.is_fully_addressable:  # several processes
        want = np.asarray(want)
        assert got.shape == want.shape, (got.shape, want.shape)
        for shard in got.addressable_shards:
            same_bits(shard.data, want[shard.index])
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                want.shape, want.dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), "values differ"


def spec_of(out):
    spec = tuple(out.sharding.spec)
    return str(spec + (None,) * (out.ndim - len(spec)))


def np_gather(src, offsets, index, num, pad, dim, L):
    """Reference for unbatched src with check_bounds=True."""
    lead = tuple(offsets[:dim])
    rows = []
    for i, k in enumerate(index):
        r = int(offsets[dim]) + int(k)
        ok = i < num and 0 <= r < src.shape[dim] and all(
            0 <= o < s for o, s in zip(lead, src.shape[:dim]))
        row = src[lead + (r,)] if ok else np.full(src.shape[dim + 1:], pad, src.dtype)
        fill = np.full(row.shape[:-1] + (L - row.shape[-1],), pad, src.dtype)
        rows.append(np.concatenate([row, fill], axis=-1))
    return np.stack(rows)


rng = np.random.default_rng(0)
DEV = jax.devices()
NDEV = len(DEV)
MESHES = {"auto": Mesh(np.array(DEV), ("x",)),
          "explicit": jax.make_mesh((NDEV,), ("x",), axis_types=(AxisType.Explicit,))}
M, K, R, N = 16, 32, 40, 12
c_rows = rng.random((M, 1)) > 0.5
x = rng.standard_normal((M, K)).astype(np.float32)
y_row = rng.standard_normal((1, K)).astype(np.float32)
c_full = rng.random((M, K)) > 0.5
src = rng.standard_normal((R, 6)).astype(np.float32)  # 6 floats -> rows padded to 8
idx = rng.integers(-2, R + 2, N).astype(np.int32)  # some out of range: pad rows
B = 4
bsrc = rng.standard_normal((B, R, 8)).astype(np.float32)
bidx = rng.integers(0, R, (B, N)).astype(np.int32)


def local_case(mesh, f, arg_specs, want, want_spec, *, local=True):
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in arg_specs]
    jf = jax.jit(f)
    colls, targets, _ = compiled_info(jf, *args)
    out = jf(*args)
    same_bits(out, want)
    assert spec_of(out) == str(tuple(want_spec)), (spec_of(out), want_spec)
    if local:
        assert not colls, colls
    return {"collectives": colls, "targets": targets, "spec": spec_of(out)}


def run_local_checks():
    for mname, mesh in MESHES.items():
        @check(f"select_rows_sharded[{mname}]")
        def _():
            return local_case(mesh, jax_ext.where,
                              [(c_rows, P("x", None)), (x, P("x", None)), (y_row, P())],
                              np.where(c_rows, x, y_row), ("x", None))

        @check(f"select_cols_sharded_broadcast_cond[{mname}]")
        def _():
            return local_case(mesh, jax_ext.select,
                              [(c_rows, P()), (x, P(None, "x")), (y_row, P(None, "x"))],
                              np.where(c_rows, x, y_row), (None, "x"))

        @check(f"gather_index_sharded[{mname}]")
        def _():
            def f(s, i, num):
                return jax_ext.gather(s, [1], 0, i, num_indices=num, pad_value=-1.0)
            args = [(src, P()), (idx, P("x")), (np.int64(N - 3), P())]
            return local_case(mesh, f, args, np_gather(src, [1], idx, N - 3, -1.0, 0, 8),
                              ("x", None))

        @check(f"vmap_gather_batch_sharded[{mname}]")
        def _():
            f = jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i))
            want = np.stack([np_gather(bsrc[b], [0], bidx[b], N, 0.0, 0, 8) for b in range(B)])
            return local_case(mesh, f, [(bsrc, P("x", None, None)), (bidx, P("x", None))], want,
                              ("x", None, None))

        @check(f"gather_src_rows_sharded_communicates[{mname}]")
        def _():
            def f(s, i):
                return jax_ext.gather(s, [0], 0, i)
            rec = local_case(mesh, f, [(src, P("x", None)), (idx, P())],
                             np_gather(src, [0], idx, N, 0.0, 0, 8), (None, None), local=False)
            assert "jax_ext_gather_v2" in rec["targets"], rec
            return rec


    @check("gather_dim1_index_on_two_axes[2x2]")
    def _():
        mesh = Mesh(np.array(DEV).reshape(2, 2), ("a", "b"))
        s3 = rng.standard_normal((3, R, 5, 8)).astype(np.float32)
        i = rng.integers(0, R, 12).astype(np.int64)

        def f(s, i, num):
            return jax_ext.gather(s, [2, 0], 1, i, num_indices=num)
        return local_case(mesh, f, [(s3, P()), (i, P(("a", "b"))), (np.int64(7), P())],
                          np_gather(s3, [2, 0], i, 7, 0.0, 1, 8), (("a", "b"), None, None))


    @check("select_rows_and_cols[2x2]")
    def _():
        mesh = Mesh(np.array(DEV).reshape(2, 2), ("a", "b"))
        return local_case(mesh, jax_ext.where, [(c_full, P("a", "b")), (x, P("a", "b")),
                                                (y_row, P(None, "b"))],
                          np.where(c_full, x, y_row), ("a", "b"))


    @check("grad_select_and_gather_sharded[auto]")
    def _():
        mesh = MESHES["auto"]
        # Small integers: every sum is exact whatever order the reductions take.
        xs = rng.integers(-4, 5, (M, K)).astype(np.float32)
        ts = rng.integers(-4, 5, (R, 8)).astype(np.float32)
        ii = rng.integers(0, R, N).astype(np.int32)

        def loss(x, y, t, i):
            a = jnp.sum(jax_ext.where(c_rows, x, y) * 3.0)
            return a + jnp.sum(jax_ext.gather(t, [0], 0, i) * 2.0)
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        args = [put(xs, P("x", None)), put(y_row, P()), put(ts, P()), put(ii, P("x"))]
        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        colls, targets, _ = compiled_info(g, *args)
        gx, gy, gt = g(*args)
        same_bits(gx, np.where(c_rows, 3.0, 0.0).astype(np.float32) * np.ones((M, K), np.float32))
        same_bits(gy, np.sum(np.where(c_rows, 0.0, 3.0) * np.ones((M, K)), 0,
                             keepdims=True).astype(np.float32))
        want_t = np.zeros((R, 8), np.float32)
        np.add.at(want_t, ii, 2.0)
        same_bits(gt, want_t)
        for t in ("jax_ext_select_v2", "jax_ext_scatter_add_v2"):  # the primal gather is dead
            assert t in targets, targets
        return {"collectives": colls, "targets": targets, "spec": spec_of(gx)}


    @check("shard_map_select_and_gather[auto]")
    def _():
        mesh = MESHES["auto"]

        def body(c, x, y, s, i):
            return jax_ext.where(c, x, y), jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i))(s, i)
        f = jax.jit(jax.shard_map(body, mesh=mesh,
                                  in_specs=(P("x"), P("x"), P(), P("x"), P("x")),
                                  out_specs=(P("x"), P("x"))))
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        args = [put(c_rows, P("x")), put(x, P("x")), put(y_row, P()), put(bsrc, P("x")),
                put(bidx, P("x"))]
        colls, targets, _ = compiled_info(f, *args)
        o1, o2 = f(*args)
        same_bits(o1, np.where(c_rows, x, y_row))
        same_bits(o2, np.stack([np_gather(bsrc[b], [0], bidx[b], N, 0.0, 0, 8) for b in range(B)]))
        assert not colls, colls
        assert {"jax_ext_select_v2", "jax_ext_gather_v2"} <= set(targets), targets
        return {"collectives": colls, "targets": targets, "spec": spec_of(o1)}


    @check("select_donated_sharded_in_place[auto]")
    def _():
        mesh = MESHES["auto"]
        f = jax.jit(jax_ext.where, donate_argnums=1)
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        args = [put(c_full, P("x")), put(x, P("x")), put(y_row, P())]
        colls, targets, text = compiled_info(f, *args)
        jax.block_until_ready(args)
        ptrs = {s.device: s.data.unsafe_buffer_pointer() for s in args[1].addressable_shards}
        out = f(*args)
        same_bits(out, np.where(c_full, x, y_row))
        assert not colls, colls
        # Each shard of x is aliased to its block of the result, with no copy. (Whether the
        # runtime then hands back the very buffer is its choice: recorded, not asserted.)
        assert "input_output_alias={ {}: (1, {}" in text, "x is not aliased to the result"
        assert "output_to_operand_aliasing" in text and " copy(" not in text
        assert args[1].is_deleted()
        reused = {s.device: s.data.unsafe_buffer_pointer()
                  for s in out.addressable_shards} == ptrs
        return {"collectives": colls, "targets": targets, "spec": spec_of(out),
                "buffers_reused": reused}


    @check("explicit_conflicting_shardings_raise[explicit]")
    def _():
        mesh = MESHES["explicit"]
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        try:
            jax.jit(jax_ext.where)(put(c_full, P("x", None)), put(x, P(None, "x")), y_row)
        except Exception as e:
            assert type(e).__name__ == "ShardingTypeError", e
        else:
            raise AssertionError("conflicting explicit shardings should raise")

    @check("single_device_jit_unchanged")
    def _():
        text = jax.jit(jax_ext.where).lower(c_rows, x, y_row).as_text()
        assert text.count("stablehlo.custom_call") == 1, text
        assert "CustomSPMDPartitioning" not in text


# --- the matrix: every implementation, both kinds of mesh axes ----------------------------

IMPLS = ("native", "lax", "auto")
BF16 = np.dtype(ml_dtypes.bfloat16)


def specials(shape, dtype):
    """Random values with -0.0, a signalling NaN and a NaN with a payload mixed in."""
    dtype = np.dtype(dtype)
    u = np.dtype(f"uint{8 * dtype.itemsize}")
    bits = {2: [0x8000, 0x7F81, 0x7FC5, 0xFFE5], 4: [0x80000000, 0x7F800001, 0x7FC00123,
            0xFFC00005]}[dtype.itemsize]
    v = rng.standard_normal(shape).astype(dtype)
    flat = v.reshape(-1).view(u)
    flat[::3] = np.resize(np.array(bits, u), flat[::3].size)
    return v


def np_where(c, x, y):
    """numpy on the raw bits (numpy's where on floats could canonicalize nothing, but the
    broadcast scalar must arrive as the dtype's bits)."""
    x, y = np.asarray(x), np.asarray(y, dtype=np.asarray(x).dtype)
    u = np.dtype(f"uint{8 * x.dtype.itemsize}")
    return np.where(c, x.view(u), y.view(u)).view(x.dtype)


def global_array(a, sharding):
    """`a` placed by `sharding`, from the same host data in every process (one process
    or several: each builds only its own shards)."""
    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


# The matrix's kinds of mesh: {kind: (mesh, set it with jax.set_mesh?)}. "explicit_noset"
# is jax.make_mesh's default, explicit axes, with no mesh set: arrays placed on it carry
# their mesh in their types, and jax_ext must find it there (as jnp does).
KINDS = {"auto": (MESHES["auto"], False), "explicit": (MESHES["explicit"], True),
         "explicit_noset": (jax.make_mesh((NDEV,), ("x",)), False)}
assert all(t == AxisType.Explicit for t in KINDS["explicit_noset"][0].axis_types)


def mesh_scope(kind):
    mesh, scoped = KINDS[kind]
    return jax.set_mesh(mesh) if scoped else contextlib.nullcontext()


def matrix_case(kind, impl, f, arg_specs, want, *, twin=None, local=False, comm=None):
    """f under impl on the mesh `kind`: bits equal to `want` (an array or a tuple);
    local: no collective; twin (the jnp program): the same bits where it is exact, and no
    collective the twin does not hold, or, with `comm`, none outside that set."""
    mesh = KINDS[kind][0]
    with mesh_scope(kind):
        args = [global_array(a, NamedSharding(mesh, s)) for a, s in arg_specs]
        with jax_ext.implementation(impl), _explain.recording() as decisions:
            jf = jax.jit(f)
            colls, targets, _ = compiled_info(jf, *args)
            out = jf(*args)
        outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
        for o, w in zip(outs, wants):
            same_bits(o, w)
        rec = {"collectives": colls, "targets": targets, "spec": spec_of(outs[0]),
               "decisions": sorted({f"{d.op}:{d.impl}" for d in decisions})}
        if twin is not None:
            tcolls, _, _ = compiled_info(jax.jit(twin), *args)
            rec["twin_collectives"] = tcolls
            touts = jax.jit(twin)(*args)
            for t, w in zip((touts,) if len(outs) == 1 else touts, wants):
                if t.dtype == np.float32:  # the jnp program is exact there too
                    same_bits(t, w)
            if comm is None:
                assert set(colls) <= set(tcolls), f"collectives {colls}, jnp program: {tcolls}"
    if comm is not None:
        assert set(colls) <= comm, f"collectives {colls}, expected within {sorted(comm)}"
    if local:
        assert not colls, f"collectives {colls}"
    return rec


# Shapes divisible by 8 devices. The batched-gather shapes are the issue's.
MB, KB = 16, 40
m_c = rng.random((MB, 1)) > 0.5
m_cf = rng.random((MB, KB)) > 0.5
m_x = specials((MB, KB), BF16)
m_y = specials((1, KB), BF16)
m_xf = specials((MB, KB), np.float32)
g_src = specials((64, 6), np.float32)            # 6 floats -> rows padded to 8
g_idx = rng.integers(-2, 66, 24).astype(np.int32)  # some out of range: pad rows
v_src = specials((8, 512, 64), np.float32)
v_idx = rng.integers(0, 512, (8, 128)).astype(np.int32)
vb_x = specials((8, MB, KB), BF16)
i_src = rng.integers(-3, 4, (8, 512, 64)).astype(np.float32)  # small ints: exact sums
i_x = rng.integers(-3, 4, (MB, KB)).astype(np.float32)
i_y = rng.integers(-3, 4, (MB, KB)).astype(np.float32)
i_t = rng.integers(-3, 4, (64, 8)).astype(np.float32)


def vgather(s, i):
    return jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None))(s, i)


def vtake(s, i):
    return jax.vmap(lambda s, i: jnp.take(s, i, axis=0))(s, i)


def take_loss(t, i):
    """The jnp twin of sum(gather(t, [0], 0, i) * 2) (jnp.take wraps negative indices)."""
    return jnp.sum(jnp.take(t, jnp.where(i < 0, t.shape[0], i), axis=0, mode="fill",
                            fill_value=0) * 2.0)


def grad_vmap_want():
    want = np.zeros_like(i_src)
    for b in range(8):
        np.add.at(want[b], v_idx[b], 2 * i_src[b][v_idx[b]])
    return want


def grad_rows_want():
    want = np.zeros_like(i_t)
    ok = (g_idx >= 0) & (g_idx < 64)
    np.add.at(want, g_idx[ok], 2.0)
    return want


MATRIX = {  # name: (kind, impl) -> record
    "select_batch_sharded": lambda kind, impl: matrix_case(
        kind, impl, jax_ext.where, [(m_c, P("x", None)), (m_x, P("x", None)), (m_y, P())],
        np_where(m_c, m_x, m_y), local=True),
    "where_scalar_sharded": lambda kind, impl: matrix_case(  # the where(cs, xs, 0.0)
        kind, impl, lambda c, x: jax_ext.where(c, x, 0.0),
        [(m_cf, P("x", None)), (m_xf, P("x", None))], np_where(m_cf, m_xf, 0.0),
        twin=lambda c, x: jnp.where(c, x, 0.0), local=True),
    "vmap_select_batch_sharded": lambda kind, impl: matrix_case(
        kind, impl, jax.vmap(jax_ext.where, in_axes=(None, 0, None)),
        [(m_cf, P()), (vb_x, P("x", None, None)), (m_y, P())],
        np.stack([np_where(m_cf, vb_x[b], m_y) for b in range(8)]), local=True),
    "gather_index_sharded": lambda kind, impl: matrix_case(
        kind, impl, lambda s, i, n: jax_ext.gather(s, [1], 0, i, num_indices=n, pad_value=-0.0),
        [(g_src, P()), (g_idx, P("x")), (np.int64(20), P())],
        np_gather(g_src, [1], g_idx, 20, np.float32(-0.0), 0, 8), local=True),
    "gather_rows_sharded_exact": lambda kind, impl: matrix_case(  # -0.0 and sNaN rows
        kind, impl, lambda s, i: jax_ext.gather(s, [0], 0, i), [(g_src, P("x", None)),
                                                               (g_idx, P())],
        np_gather(g_src, [0], g_idx, len(g_idx), 0.0, 0, 8)),
    "vmap_gather_batch_sharded": lambda kind, impl: matrix_case(
        kind, impl, vgather, [(v_src, P("x", None, None)), (v_idx, P("x", None))],
        np.stack([v_src[b][v_idx[b]] for b in range(8)]), twin=vtake, local=True),
    "grad_vmap_gather_batch_sharded": lambda kind, impl: matrix_case(  # the snippet
        kind, impl, jax.grad(lambda s, i: jnp.sum(vgather(s, i) ** 2)),
        [(i_src, P("x", None, None)), (v_idx, P("x", None))], grad_vmap_want(),
        twin=jax.grad(lambda s, i: jnp.sum(vtake(s, i) ** 2))),
    "grad_gather_rows_sharded": lambda kind, impl: matrix_case(
        kind, impl, jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) * 2.0)),
        [(i_t, P("x", None)), (g_idx, P())], grad_rows_want(),
        # Explicit axes: jnp.take asks for an out_sharding here; jax_ext.gather takes it.
        twin=None if kind != "auto" else jax.grad(take_loss)),
    "grad_gather_index_sharded": lambda kind, impl: matrix_case(
        kind, impl, jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) * 2.0)),
        [(i_t, P()), (g_idx, P("x"))], grad_rows_want(),
        twin=None if kind != "auto" else jax.grad(take_loss),  # as above
        # The rows must meet: jnp all-reduces partial sums, the kernel all-gathers the
        # cotangent rows (and adds them in index order: deterministic).
        comm={"all-gather", "all-reduce"}),
    "grad_select_batch_sharded": lambda kind, impl: matrix_case(
        kind, impl, jax.grad(lambda x, y: jnp.sum(jax_ext.where(m_cf, x, y) ** 2),
                             argnums=(0, 1)),
        [(i_x, P("x", None)), (i_y, P("x", None))],
        (np.where(m_cf, 2 * i_x, 0.0).astype(np.float32),
         np.where(m_cf, 0.0, 2 * i_y).astype(np.float32)),
        twin=jax.grad(lambda x, y: jnp.sum(jnp.where(m_cf, x, y) ** 2), argnums=(0, 1))),
}


# --- uneven shards: lengths the mesh does not divide ------------------------------------
# NDEV + 1 (9 rows over 8 devices, 5 over 4): XLA pads the last shard. An index sharded
# so, carried as int64, made XLA's SPMD partitioner abort the process on the gradient's
# scatter. jax refuses such arrays under explicit axes (a sharded type must divide its
# dim), so these programs spread their operands themselves: with_sharding_constraint on
# auto axes, and inside jax.sharding.auto_axes on the explicit kinds, as a user of
# explicit axes would. The operands arrive replicated.
U = NDEV + 1
IDX = np.int64 if X64 else np.int32  # the index dtype a user has: int64 under x64
u_idx = np.resize(np.array([3, -1, 3, 63, 64, 0, 17, 3, 40], IDX), U)  # pads, duplicates
u_src = specials((U, 6), np.float32)             # U rows, padded to 8 columns
u_rows_idx = np.array([0, U - 1, -2, U, 1, 1, U - 2, 3, 2, 0, 5, U + 3], np.int32)  # pads
u_t = rng.integers(-3, 4, (U, 8)).astype(np.float32)  # small ints: exact sums
u_bsrc = specials((U, 24, 8), np.float32)
u_bt = rng.integers(-3, 4, (U, 24, 8)).astype(np.float32)
u_bidx = rng.integers(-1, 26, (U, 5)).astype(IDX)  # -1, 24 and 25: pad rows
u_c = rng.random((U, 1)) > 0.5
u_x = specials((U, KB), np.float32)
u_y = specials((1, KB), np.float32)


def uneven(kind, body, specs):
    """`body` with each operand constrained to its spec in `specs` inside the program."""
    mesh = KINDS[kind][0]
    if kind == "auto":
        return lambda *a: body(*[jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))
                                 for x, s in zip(a, specs)])
    # Inside auto_axes the mesh in context has auto axes, which a bare spec names.
    return jax.sharding.auto_axes(
        lambda *a: body(*[jax.lax.with_sharding_constraint(x, s) for x, s in zip(a, specs)]),
        out_sharding=NamedSharding(mesh, P()))


def uneven_case(kind, impl, body, args, specs, want):
    return matrix_case(kind, impl, uneven(kind, body, specs), [(a, P()) for a in args], want)


def add_rows_want(t, idx, scale):
    """The gradient of sum(gather(t, [0], 0, idx) * scale): scale added at every valid row."""
    want = np.zeros_like(t)
    ok = (idx >= 0) & (idx < t.shape[0])
    np.add.at(want, idx[ok], scale)
    return want


def grad_vmap_uneven_want():
    want = np.zeros_like(u_bt)
    for b in range(U):
        ok = (u_bidx[b] >= 0) & (u_bidx[b] < u_bt.shape[1])
        np.add.at(want[b], u_bidx[b][ok], 2 * u_bt[b][u_bidx[b][ok]])
    return want


def np_vgather(src, idx):
    return np.stack([np_gather(src[b], [0], idx[b], idx.shape[1], 0.0, 0, src.shape[-1])
                     for b in range(src.shape[0])])


MATRIX.update({
    "gather_index_uneven": lambda kind, impl: uneven_case(
        kind, impl, lambda s, i, n: jax_ext.gather(s, [1], 0, i, num_indices=n, pad_value=-0.0),
        [g_src, u_idx, np.int64(U - 2)], [P(), P("x"), P()],
        np_gather(g_src, [1], u_idx, U - 2, np.float32(-0.0), 0, 8)),
    "grad_gather_index_uneven": lambda kind, impl: uneven_case(  # the repro
        kind, impl, jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) * 2.0)),
        [i_t, u_idx], [P(), P("x")], add_rows_want(i_t, u_idx, 2.0)),
    "gather_rows_uneven": lambda kind, impl: uneven_case(  # -0.0 and sNaN rows
        kind, impl, lambda s, i: jax_ext.gather(s, [0], 0, i), [u_src, u_rows_idx],
        [P("x", None), P()], np_gather(u_src, [0], u_rows_idx, len(u_rows_idx), 0.0, 0, 8)),
    "grad_gather_rows_uneven": lambda kind, impl: uneven_case(
        kind, impl, jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) * 2.0)),
        [u_t, u_rows_idx], [P("x", None), P()], add_rows_want(u_t, u_rows_idx, 2.0)),
    "vmap_gather_batch_uneven": lambda kind, impl: uneven_case(
        kind, impl, vgather, [u_bsrc, u_bidx], [P("x", None, None), P("x", None)],
        np_vgather(u_bsrc, u_bidx)),
    "grad_vmap_gather_batch_uneven": lambda kind, impl: uneven_case(
        kind, impl, jax.grad(lambda s, i: jnp.sum(vgather(s, i) ** 2)), [u_bt, u_bidx],
        [P("x", None, None), P("x", None)], grad_vmap_uneven_want()),
    # float32: XLA:CPU pads an unevenly spread bfloat16 operand, and all-gathers such a
    # result, through float32, which quiets NaNs (select_batch_sharded covers bfloat16).
    "select_batch_uneven": lambda kind, impl: uneven_case(
        kind, impl, jax_ext.where, [u_c, u_x, u_y], [P("x", None), P("x", None), P()],
        np_where(u_c, u_x, u_y)),
})


# --- packed dtypes: every code of int2, uint2, int4, uint4 and float4_e2m1fn -----------
# They cross devices as uint8 (jax_ext._partition.wire_dtype): XLA:CPU sums float4 in
# float16 (-0 comes back +0) and has no all-reduce of 2-bit integers, so a row-sharded
# jnp.take of either gives other bits or raises.
p_idx = rng.integers(-2, 66, 24).astype(np.int32)  # some out of range: pad rows
p_bidx = rng.integers(-1, 26, (8, 5)).astype(np.int32)
F4 = np.dtype(ml_dtypes.float4_e2m1fn)


def packed(kind, impl, case):
    """case(dtype) -> (f, arg_specs, want, local) for every packed dtype, as one program
    (one compilation) of them all."""
    cases = [case(dt) for dt in map(np.dtype, SUB_BYTE_DTYPES)]
    counts = [len(c[1]) for c in cases]

    def f(*args):
        outs, k = [], 0
        for (g, *_), n in zip(cases, counts):
            outs.append(g(*args[k:k + n]))
            k += n
        return tuple(outs)
    return matrix_case(kind, impl, f, [a for c in cases for a in c[1]],
                       tuple(c[2] for c in cases), local=cases[0][3])


def packed_table(dt, shape, seed):
    return random_values(np.random.default_rng(seed), shape, dt)


def packed_pad(dt):
    return np.array(3, np.uint8).view(dt)  # code 3: -1 for int2, 1.5 for float4


def grad_float4_want(t, idx, ct):
    """float32 sums of the cotangent rows in index order, rounded once to float4."""
    want = np.zeros(t.shape, np.float32)
    for k, i in enumerate(idx):
        if 0 <= i < t.shape[0]:
            want[i] += ct[k, :t.shape[1]].astype(np.float32)
    return want.astype(t.dtype)


MATRIX.update({
    "subbyte_gather_rows_sharded": lambda kind, impl: packed(kind, impl, lambda dt: (
        lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=packed_pad(dt)),
        [(packed_table(dt, (64, 6), 1), P("x", None)), (p_idx, P())],
        np_gather(packed_table(dt, (64, 6), 1), [0], p_idx, 24, packed_pad(dt), 0, 32),
        False)),
    "subbyte_gather_index_sharded": lambda kind, impl: packed(kind, impl, lambda dt: (
        lambda s, i: jax_ext.gather(s, [1], 0, i, num_indices=20, pad_value=packed_pad(dt)),
        [(packed_table(dt, (64, 6), 2), P()), (p_idx, P("x"))],
        np_gather(packed_table(dt, (64, 6), 2), [1], p_idx, 20, packed_pad(dt), 0, 32),
        True)),
    "subbyte_vmap_gather_batch_sharded": lambda kind, impl: packed(kind, impl, lambda dt: (
        vgather, [(packed_table(dt, (8, 24, 8), 3), P("x", None, None)),
                  (p_bidx, P("x", None))],
        np_vgather(packed_table(dt, (8, 24, 8), 3), p_bidx), True)),
    "subbyte_gather_rows_uneven": lambda kind, impl: packed(kind, impl, lambda dt: (
        uneven(kind, lambda s, i: jax_ext.gather(s, [0], 0, i), [P("x", None), P()]),
        [(packed_table(dt, (U, 6), 4), P()), (u_rows_idx, P())],
        np_gather(packed_table(dt, (U, 6), 4), [0], u_rows_idx, len(u_rows_idx),
                  np.zeros((), dt), 0, 32), False)),
    "grad_float4_gather_rows_sharded": lambda kind, impl: matrix_case(
        kind, impl, lambda t, i, c: jax.vjp(lambda t: jax_ext.gather(t, [0], 0, i), t)[1](c)[0],
        [(packed_table(F4, (64, 6), 5), P("x", None)), (p_idx, P()),
         (packed_table(F4, (24, 32), 6), P())],
        grad_float4_want(packed_table(F4, (64, 6), 5), p_idx, packed_table(F4, (24, 32), 6))),
})


def run_matrix():
    for name, fn in MATRIX.items():
        for kind in KINDS:
            for impl in IMPLS:
                check(f"{name}[{impl},{kind}]")(lambda: fn(kind, impl))


# --- jax.export -------------------------------------------------------------------------

def exported_fn(c, x, y, s, i):
    return jax_ext.where(c, x, y) * 2.0, jax_ext.gather(s, [0], 0, i, pad_value=7.0)


EXPORT_ARGS = (c_rows, x, y_row, src, idx)
EXPORT_SPECS = (P("x", None), P("x", None), P(), P(), P("x"))


def export_want():
    return (np.where(c_rows, x, y_row) * np.float32(2.0),
            np_gather(src, [0], idx, N, 7.0, 0, 8))


def run_export(outdir):
    @check("export_needs_export_checks")
    def _():
        try:
            jax.export.export(jax.jit(exported_fn))(*EXPORT_ARGS)
        except ValueError as e:
            assert "jax_ext_select_v2" in str(e) or "custom call" in str(e).lower(), e
        else:
            raise AssertionError("export without jax_ext.export_checks() should be refused")

    @check("export_serialize[1dev]")
    def _():
        exp = jax.export.export(jax.jit(exported_fn),
                                disabled_checks=jax_ext.export_checks())(*EXPORT_ARGS)
        with open(os.path.join(outdir, "exp1.bin"), "wb") as f:
            f.write(exp.serialize())
        for got, want in zip(exp.call(*EXPORT_ARGS), export_want()):
            same_bits(got, want)

    @check("export_serialize[4dev]")
    def _():
        mesh = MESHES["auto"]
        shs = tuple(NamedSharding(mesh, s) for s in EXPORT_SPECS)
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                 for a, s in zip(EXPORT_ARGS, shs)]
        exp = jax.export.export(jax.jit(exported_fn, in_shardings=shs),
                                disabled_checks=jax_ext.export_checks())(*specs)
        text = exp.mlir_module()
        assert "CustomSPMDPartitioning" not in text  # a Python callback: not serializable
        with open(os.path.join(outdir, "exp4.bin"), "wb") as f:
            f.write(exp.serialize())


def load_exports(outdir):
    """In a fresh process: deserialize both exports and call them."""
    for tag in ("1dev", "4dev"):
        @check(f"export_roundtrip_fresh_process[{tag}]")
        def _():
            with open(os.path.join(outdir, f"exp{tag[0]}.bin"), "rb") as f:
                exp = jax.export.deserialize(bytearray(f.read()))
            args = EXPORT_ARGS
            if tag == "4dev":
                mesh = MESHES["auto"]
                args = [jax.device_put(a, NamedSharding(mesh, s))
                        for a, s in zip(EXPORT_ARGS, EXPORT_SPECS)]
            colls, targets, _ = compiled_info(jax.jit(exp.call), *args)
            for got, want in zip(jax.jit(exp.call)(*args), export_want()):
                same_bits(got, want)
            if tag == "4dev":
                # Exported on auto mesh axes: every call site that would be partitioned is
                # the lax path, which XLA partitioned here (no kernel, no communication).
                assert not [t for t in targets if t.startswith("jax_ext_")], targets
                assert colls == [], colls
            else:
                assert {"jax_ext_select_v2", "jax_ext_gather_v2"} <= set(targets), targets
            return {"collectives": colls, "targets": targets}


# jax_partitioning (jax 0.12+, off by default): jax lowers each op of an Explicit mesh
# through a shard_map of its own. jax_ext's ops work there on every path, with jnp's result
# sharding and numpy's bits, and partition without communication as with the option off.
PARTITIONING = "jax_partitioning" in jax.config.values


def run_partitioning():
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    ok_idx = np.abs(idx) % R  # in range: jnp's fill mode wraps negative indices
    gather = lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=0.0, align_bytes=None)  # noqa: E731
    take = lambda s, i: s.at[i].get(mode="fill", fill_value=0.0,  # noqa: E731
                                     out_sharding=P(*jax.typeof(i).sharding.spec, None))
    programs = {
        "where_blocks": (jax_ext.where, jnp.where,
                         [(c_full, P("x", "y")), (x, P("x", "y")), (x * 2, P("x", "y"))]),
        "where_rows": (jax_ext.where, jnp.where,
                       [(c_full, P("x")), (x, P("x")), (-x, P("x"))]),
        "gather_index_sharded": (gather, take, [(src, P()), (ok_idx, P("x"))]),
    }
    for impl in ("native", "lax", "auto"):
        for name, (fn, twin, placed) in programs.items():
            @check(f"jax_partitioning_{name}[{impl}]")
            def _():
                args = [put(a, s) for a, s in placed]
                with _partitioning(True), jax.set_mesh(mesh), jax_ext.implementation(impl):
                    want = jax.jit(twin)(*args)
                    got = jax.jit(fn)(*args)
                    colls, _, _ = compiled_info(jax.jit(fn), *args)
                same_bits(got, want)
                assert got.sharding.spec == want.sharding.spec, (got.sharding, want.sharding)
                assert colls == [], colls
                return {"collectives": colls}

        @check(f"jax_partitioning_grad_gather[{impl}]")
        def _():
            # jnp's gather has no partitioning rule for this gradient: compare with the
            # same program with the option off.
            args = [put(src, P()), put(ok_idx, P("x"))]
            f = jax.jit(jax.grad(lambda s, i: jnp.sum(gather(s, i) ** 2)))
            with jax.set_mesh(mesh), jax_ext.implementation(impl):
                want = f(*args)
                with _partitioning(True):
                    got = f(*args)
            same_bits(got, want)
            assert got.sharding.spec == want.sharding.spec, (got.sharding, want.sharding)


@contextlib.contextmanager
def _partitioning(value):
    old = jax.config.values["jax_partitioning"]
    jax.config.update("jax_partitioning", value)
    try:
        yield
    finally:
        jax.config.update("jax_partitioning", old)


def run_gspmd():
    """Last: switching the partitioner off must neither crash nor change values."""
    jax.config.update("jax_use_shardy_partitioner", False)

    @check("gspmd_partitioner_falls_back[auto]")
    def _():
        mesh = MESHES["auto"]
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        f = jax.jit(lambda c, x, y, s, i: (jax_ext.where(c, x, y),
                                           jax_ext.gather(s, [1], 0, i)))
        args = [put(c_rows, P("x")), put(x, P("x")), put(y_row, P()), put(src, P()),
                put(idx, P("x"))]
        colls, targets, _ = compiled_info(f, *args)
        o1, o2 = f(*args)
        same_bits(o1, np.where(c_rows, x, y_row))
        same_bits(o2, np_gather(src, [1], idx, N, 0.0, 0, 8))
        return {"collectives": colls, "targets": targets}


if __name__ == "__main__":
    mode, outdir = sys.argv[1], sys.argv[2]
    assert mode == "matrix" or NDEV == 4, f"needs 4 devices (XLA_FLAGS), got {NDEV}"
    if mode == "matrix":
        run_matrix()
        name = "matrix.json"
    elif mode == "run":
        with jax_ext.implementation("native"):  # these checks pin the kernels' partitioning
            run_local_checks()
            run_export(outdir)
        run_matrix()
        if PARTITIONING:
            run_partitioning()
        with jax_ext.implementation("native"):
            # Last: it switches the partitioner off for the process. Only where jax can
            # still select GSPMD: jax 0.12 made jax_use_shardy_partitioner a no-op (Shardy
            # is the only partitioner), so there the check would repeat the Shardy ones.
            if _compat_sharding.GSPMD_SELECTABLE:
                run_gspmd()
        name = "results.json"
    else:
        RESULTS.clear()
        load_exports(outdir)
        name = "load.json"
    with open(os.path.join(outdir, name), "w") as f:
        json.dump(RESULTS, f, indent=1)
