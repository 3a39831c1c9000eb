"""The checks of test_row_sharding.py: tables sharded along their rows, and operands of
every op sharded differently, on 8 forced host devices, in a child process (see
test_sharding.py for why a child).

    python tests/row_sharding_checks.py OUTDIR [nox64]   # OUTDIR/rows.json

Each check records {ok, error, ...} under its name; the parent asserts them. For every
compiled program the record holds its collectives (kind, element type, bytes), read from
the compiled HLO, and its per-device temp bytes from ``memory_analysis()``; each check
itself asserts the bits against numpy (or against the same program on one device).
"""
import json
import os
import re
import sys

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

X64 = "nox64" not in sys.argv[2:]
jax.config.update("jax_enable_x64", X64)

import jax_ext  # noqa: E402
import ml_dtypes  # noqa: E402
from references import SUB_BYTE_DTYPES, bit_width, random_values, recorder  # noqa: E402

IMPLS = ("native", "lax", "auto")
COLL = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* (all-gather|all-reduce|all-to-all|"
                  r"collective-permute|reduce-scatter)(?:-start)?\(")
WIDTH = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
         "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
RESULTS = {}
rng = np.random.default_rng(0)
DEV = jax.devices()
MESH = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
EMESH = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
MESH2 = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
BF16, E5M2 = np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e5m2)
DEFAULT_INT = np.int64 if X64 else np.int32


check = recorder(RESULTS)


def collectives(text):
    """[(kind, element type, bytes)] of every collective in a compiled HLO text."""
    out = []
    for ty, dims, kind in COLL.findall(text):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        out.append((kind, ty, n * WIDTH.get(ty, 8)))
    return out


# A fusion of nothing but a bitcast-convert: a whole copy of a buffer, to change its type.
CONVERT = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* fusion\([^)]*\), kind=kLoop, "
                     r"calls=%wrapped_bitcast-convert")


def conversions(text):
    """[bytes] of every buffer the compiled program copies only to change its type (a
    value converted to or from its wire dtype around a kernel, say)."""
    return [int(np.prod([int(d) for d in dims.split(",") if d])) * WIDTH.get(ty, 8)
            for ty, dims in CONVERT.findall(text)]


def compiled(f, *args):
    c = jax.jit(f).lower(*args).compile()
    return {"collectives": collectives(c.as_text()), "conversions": conversions(c.as_text()),
            "temp": int(c.memory_analysis().temp_size_in_bytes)}


def bits(dtype, shape):
    """Random bit patterns of `dtype` (NaN payloads, signalling NaNs, -0.0, denormals;
    every code of a packed dtype)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if bit_width(dtype) < 8:
        return random_values(rng, shape, dtype)
    u = np.dtype(f"uint{8 * dtype.itemsize}")
    return rng.integers(0, np.iinfo(u).max, shape, dtype=u, endpoint=True).view(dtype)


def same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                want.shape, want.dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), "values differ"


def np_gather(src, index, num, pad, L):
    """gather(src, [0], 0, index, num_indices=num, pad_value=pad) of a 2-D src, by a loop."""
    out = np.empty((len(index), L), src.dtype)
    for i, k in enumerate(index):
        ok = i < num and 0 <= int(k) < src.shape[0]
        row = src[int(k)] if ok else np.full(src.shape[1:], pad, src.dtype)
        out[i, :src.shape[1]] = row
        out[i, src.shape[1]:] = pad
    return out


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def sliced(f, sizes, specs, mesh=MESH):
    """`f` on its operands' leading `sizes` elements, each constrained to its spec inside
    the program: shards the mesh does not divide (jax places only even ones)."""
    wsc = jax.lax.with_sharding_constraint
    return lambda *a: f(*[wsc(x[:k], NamedSharding(mesh, sp)) if k is not None else x
                          for x, k, sp in zip(a, sizes, specs)])


def spec_of(out):
    spec = tuple(out.sharding.spec)
    return [None if e is None else str(e) for e in spec + (None,) * (out.ndim - len(spec))]


def reasons(f, *args):
    """explain()'s reason for every jax_ext call site of f."""
    return [d.reason for d in jax_ext.explain(f, *args)]


def rows_case(impl, f, args, want, *, mesh=MESH):
    with jax_ext.implementation(impl):
        rec = compiled(f, *args)
        rec["explain"] = reasons(f, *args)
        out = jax.jit(f)(*args)
    same_bits(out, want)
    rec["spec"] = spec_of(out)
    return rec


# --- forward: a table sharded along its rows --------------------------------------------
R, C, N = 4096, 64, 256
PAD = {np.dtype(np.float32): np.uint32(0x7FC00123).view(np.float32),
       BF16: np.uint16(0x7F85).view(BF16), E5M2: np.uint8(0xFD).view(E5M2)}
# The packed dtypes: every code in each table; code 3 pads (-1 for int2, 1.5 for float4).
PACKED = [np.dtype(d) for d in SUB_BYTE_DTYPES]
PAD.update({dt: np.uint8(3).view(dt) for dt in PACKED})


def unsigned(x):
    """The bits of `x` as unsigned integers, inside the program (a packed dtype's codes as
    uint8): what leaves it is then no float that XLA's own reshard after the call moves."""
    if bit_width(x.dtype) < 8:
        u = np.dtype(getattr(jnp, f"uint{bit_width(x.dtype)}"))
        return jax.lax.convert_element_type(jax.lax.bitcast_convert_type(x, u), np.uint8)
    return jax.lax.bitcast_convert_type(x, np.dtype(f"uint{8 * x.dtype.itemsize}"))


def forward_checks():
    for dt in [np.dtype(np.float32), BF16, E5M2] + PACKED:
        for rows, n, ispec in ((R, N, P("x")), (R, N, P()), (R - 5, N - 6, P("x"))):
            table = bits(dt, (R, C - 2))  # C - 2 columns: padding columns too
            idx = rng.integers(-3, rows + 3, N).astype(np.int32)
            L = -(-(C - 2) * dt.itemsize // 32) * 32 // dt.itemsize
            num = n - 7
            want = np_gather(table[:rows], idx[:n], num, PAD[dt], L)
            args = (put(table, MESH, P("x", None)), put(idx, MESH, ispec))
            f = lambda t, i: jax_ext.gather(t, [0], 0, i, num_indices=num, pad_value=PAD[dt])
            if rows != R:
                # The program's result is replicated (jax keeps no uneven shards), and
                # that reshard, after jax_ext's call, is XLA's: a bfloat16 all-gather
                # there rewrites NaN payloads as for any program. So the bits are read
                # inside the program, as unsigned integers.
                f = sliced(lambda t, i, f=f: unsigned(f(t, i)), (rows, n), (P("x", None), ispec))
                want = want.view(np.uint8 if dt in PACKED else f"uint{8 * dt.itemsize}")
            for impl in IMPLS:
                tag = f"{dt.name},{rows}x{n},{'index sharded' if ispec else 'index replicated'}"

                @check(f"forward[{tag},{impl}]")
                def _():
                    rec = rows_case(impl, f, args, want)
                    rec.update(table=table.nbytes, result=want.nbytes, ndev=8)
                    return rec
    # as many indices as rows, the result replicated: copying the table moves fewer bytes
    table = bits(np.float32, (R, C))
    idx = rng.integers(0, R, R).astype(np.int32)
    for impl in IMPLS:
        @check(f"copied[{impl}]")
        def _():
            args = (put(table, MESH, P("x", None)), put(idx, MESH, P()))
            rec = rows_case(impl, lambda t, i: jax_ext.gather(t, [0], 0, i), args,
                            table[idx])
            rec.update(table=table.nbytes, result=table.nbytes, ndev=8)
            return rec

        @check(f"copied_dtypes[{impl}]")
        def _():
            # the gathered table's wire values read, the rows written in its dtype
            colls, how = [], []
            for dt in map(np.dtype, [BF16, E5M2, np.bool_, np.int8, np.float16]
                          + ([np.float64] if X64 else [])):
                t, z = bits(dt, (R, C)), np.zeros((), dt)
                args = (put(t, MESH, P("x", None)), put(idx, MESH, P()))
                f = lambda t, i, z=z: jax_ext.gather(t, [0], 0, i, pad_value=z)
                with jax_ext.implementation(impl):
                    colls += compiled(f, *args)["collectives"]
                    how += reasons(f, *args)
                    same_bits(jax.jit(f)(*args), t[idx])
            return {"collectives": colls, "explain": how}


def explicit_checks():
    """The same under explicit axes, with jax.set_mesh and without; and the gradient's
    sharding, which follows the table's there."""
    table = bits(np.float32, (R, C))
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    want = np_gather(table, idx, N, 0.0, C)
    for impl in IMPLS:
        for scoped in (True, False):
            @check(f"explicit_forward[{'set_mesh' if scoped else 'no set_mesh'},{impl}]")
            def _():
                args = (put(table, EMESH, P("x", None)), put(idx, EMESH, P("x")))
                f = lambda t, i: jax_ext.gather(t, [0], 0, i)
                if scoped:
                    with jax.set_mesh(EMESH):
                        rec = rows_case(impl, f, args, want)
                else:
                    rec = rows_case(impl, f, args, want)
                rec.update(table=table.nbytes, result=want.nbytes, ndev=8)
                return rec

        @check(f"explicit_grad[{impl}]")
        def _():
            # small integers (no -0.0): every order of the sums gives the same bits
            t = np.round(rng.standard_normal((R, C)) * 4).astype(np.float32) + np.float32(0)
            args = (put(t, EMESH, P("x", None)), put(idx, EMESH, P("x")))
            g = jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) ** 2))
            with jax.set_mesh(EMESH), jax_ext.implementation(impl):
                rec = compiled(g, *args)
                rec["explain"] = reasons(g, *args)
                out = jax.jit(g)(*args)
            ok = (idx >= 0) & (idx < R)
            ref = np.zeros_like(t)
            np.add.at(ref, idx[ok], 2 * t[idx[ok]])
            same_bits(out, ref)
            rec.update(spec=spec_of(out), table=t.nbytes, result=N * C * 4, ndev=8)
            return rec


def auto_grad_checks():
    """A bare jax.grad on auto mesh axes, with no out_shardings: the gradient comes back
    sharded as its table (as it is typed under explicit axes), with the bits of numpy's
    scatter-add and of the jnp twin's gradient; on a 1-D and a 2-D mesh, and per example
    under vmap."""
    # small integers (no -0.0): every order of the sums gives the same bits
    t = np.round(rng.standard_normal((R, C)) * 4).astype(np.float32) + np.float32(0)
    idx = rng.integers(-3, R + 3, (2, N)).astype(np.int32)
    idx[:, : N // 4] = idx[:, N // 4: N // 2]  # repeated rows accumulate
    loss = lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) ** 2)  # noqa: E731
    twin = lambda t, i: jnp.sum(jnp.take(t, jnp.where(i < 0, R, i), axis=0,  # noqa: E731
                                         mode="fill", fill_value=0) ** 2)

    def ref(i):
        ok = (i >= 0) & (i < R)
        out = np.zeros_like(t)
        np.add.at(out, i[ok], 2 * t[i[ok]])
        return out
    cases = {"1d": (MESH, P("x", None), P("x"), jax.grad, idx[0], ref(idx[0])),
             "2d": (MESH2, P("model", "data"), P("data"), jax.grad, idx[0], ref(idx[0])),
             "vmap": (MESH, P("x", None), P(None, "x"),
                      lambda f: jax.vmap(jax.grad(f), in_axes=(None, 0)), idx,
                      np.stack([ref(i) for i in idx]))}
    for case, (mesh, tspec, ispec, grad, i, want) in cases.items():
        for impl in IMPLS:
            @check(f"auto_grad[{case},{impl}]")
            def _():
                args = (put(t, mesh, tspec), put(i, mesh, ispec))
                g = grad(loss)
                with jax_ext.implementation(impl):
                    c = jax.jit(g).lower(*args).compile()
                    rec = compiled(g, *args)
                    rec["explain"] = reasons(g, *args)
                    out = jax.jit(g)(*args)
                same_bits(out, want)
                same_bits(out, jax.jit(grad(twin))(*args))
                rec.update(spec=spec_of(out), out=int(c.memory_analysis().output_size_in_bytes),
                           table=want.nbytes, result=i.size * C * 4, ndev=8)
                return rec


# --- training step: the updated table equals one device's, bit for bit -----------------

def step(t, i, w):
    def loss(t):
        return jnp.sum(jax_ext.gather(t, [0], 0, i, pad_value=0.0).astype(jnp.float32) * w)
    return t - 0.01 * jax.grad(loss)(t).astype(t.dtype)


def step_checks():
    for dt in (np.dtype(np.float32), BF16):
        for rows, n in ((R, N), (R - 5, N - 6), (R, R)):
            t = rng.standard_normal((max(rows, R), C)).astype(dt)
            idx = rng.integers(-3, rows + 3, max(n, N)).astype(np.int32)
            idx[: n // 4] = idx[n // 4: 2 * (n // 4)]  # repeated rows accumulate
            w = rng.standard_normal((max(n, N), C)).astype(np.float32)
            even = rows % 8 == 0 and n % 8 == 0
            # uneven: the updated table is padded back to whole shards (a result jax
            # keeps sharded)
            fn = step if even else sliced(
                lambda t, i, w: jnp.pad(step(t, i, w), ((0, R - rows), (0, 0))),
                (rows, n, n), (P("x", None), P("x"), P("x", None)))
            for impl in IMPLS:
                @check(f"step[{dt.name},{rows}x{n},{impl}]")
                def _():
                    one = jax.devices()[0]
                    with jax_ext.implementation(impl):
                        want = jax.jit(step)(*(jax.device_put(a, one) for a in (
                            t[:rows], idx[:n], w[:n])))
                        want = np.pad(np.asarray(want), ((0, t.shape[0] - rows), (0, 0)))
                        args = (put(t, MESH, P("x", None)), put(idx, MESH, P("x")),
                                put(w, MESH, P("x", None)))
                        js = jax.jit(fn, out_shardings=NamedSharding(MESH, P("x", None)))
                        c = js.lower(*args).compile()
                        out = js(*args)
                    same_bits(out, want)
                    return {"collectives": collectives(c.as_text()),
                            "conversions": conversions(c.as_text()),
                            "temp": int(c.memory_analysis().temp_size_in_bytes),
                            "spec": spec_of(out), "table": t.nbytes,
                            "result": n * C * dt.itemsize, "ndev": 8}


# --- vmap, offsets into sharded dims before `dim`, a 2-D mesh -----------------------------

def other_checks():
    for impl in IMPLS:
        @check(f"vmap[{impl}]")
        def _():
            s = bits(BF16, (4, 1024, 32))
            i = rng.integers(-2, 1026, (4, 64)).astype(np.int32)
            want = np.stack([np_gather(s[b], i[b], 64, 0, 32) for b in range(4)])
            f = jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i, pad_value=0))
            rec = rows_case(impl, f, (put(s, MESH, P(None, "x", None)),
                                      put(i, MESH, P(None, "x"))), want)
            rec.update(table=s.nbytes, result=want.nbytes, ndev=8)
            return rec

        @check(f"vmap_indices[{impl}]")
        def _():
            # One table, 4 index vectors: the table gets a broadcast batch dim.
            s = bits(BF16, (1024, 32))
            i = rng.integers(-2, 1026, (4, 64)).astype(np.int32)
            want = np.stack([np_gather(s, i[b], 64, 0, 32) for b in range(4)])
            f = jax.vmap(lambda i, s: jax_ext.gather(s, [0], 0, i, pad_value=0),
                         in_axes=(0, None))
            rec = rows_case(impl, lambda s, i: f(i, s), (put(s, MESH, P("x", None)),
                                                        put(i, MESH, P(None, "x"))), want)
            rec.update(table=s.nbytes, result=want.nbytes, ndev=8)
            return rec

        @check(f"mesh2d_dims_before_dim[{impl}]")
        def _():
            # src (4, 512, 8, 32) sharded ("data", "model") along dims 0 and 1, gathered
            # along dim 1 at offset 3 in dim 0; index sharded along "data".
            s = bits(np.float32, (4, 512, 8, 32))
            i = rng.integers(-2, 514, 64).astype(np.int32)
            want = np.stack([s[3, k] if 0 <= k < 512 else np.zeros((8, 32), np.float32)
                             for k in i])
            f = lambda s, i: jax_ext.gather(s, [3, 0], 1, i, pad_value=0.0)
            rec = rows_case(impl, f, (put(s, MESH2, P("data", "model", None, None)),
                                      put(i, MESH2, P("data"))), want)
            rec.update(table=s.nbytes, result=want.nbytes, ndev=8)
            return rec


# --- every op's operands sharded differently: random bits through the reshards -----------

def reshard_checks():
    shape = (64, 48)
    for dt in (BF16, E5M2):
        c = rng.random(shape) > 0.5
        x, y = bits(dt, shape), bits(dt, shape)
        cases = {"where": lambda c, x, y: jax_ext.where(c, x, y),
                 "select": lambda c, x, y: jax_ext.select(c, x, y),
                 "where3": lambda c, x, y: jax_ext.where3(c[:, 0], x, y)}
        u = np.dtype(f"uint{8 * dt.itemsize}")
        want_full = np.where(c, x.view(u), y.view(u)).view(dt)
        want_rows = np.where(c[:, :1], x.view(u), y.view(u)).view(dt)
        for op, f in cases.items():
            want = want_rows if op == "where3" else want_full
            for impl in IMPLS:
                for out_spec in (None, P(None, "x")):
                    how = "out resharded" if out_spec else "out free"

                    @check(f"reshard[{op},{dt.name},{how},{impl}]")
                    def _():
                        args = (put(c, MESH, P()), put(x, MESH, P("x", None)),
                                put(y, MESH, P(None, "x")))
                        kw = {} if out_spec is None else {
                            "out_shardings": NamedSharding(MESH, out_spec)}
                        with jax_ext.implementation(impl):
                            jf = jax.jit(f, **kw)
                            cc = jf.lower(*args).compile()
                            out = jf(*args)
                        same_bits(out, want)
                        return {"collectives": collectives(cc.as_text())}
        # gather of a row-sharded table, its result resharded along the columns
        t = bits(dt, (512, 32))
        i = rng.integers(-2, 514, 64).astype(np.int32)
        want = np_gather(t, i, 64, np.zeros((), dt), 32)
        for impl in IMPLS:
            @check(f"reshard[gather,{dt.name},out resharded,{impl}]")
            def _():
                args = (put(t, MESH, P("x", None)), put(i, MESH, P("x")))
                f = lambda t, i: jax_ext.gather(t, [0], 0, i, pad_value=np.zeros((), dt))
                with jax_ext.implementation(impl):
                    jf = jax.jit(f, out_shardings=NamedSharding(MESH, P(None, "x")))
                    cc = jf.lower(*args).compile()
                    out = jf(*args)
                same_bits(out, want)
                return {"collectives": collectives(cc.as_text())}
    # Every other dtype crosses as the unsigned integer of its width too (bool as uint8):
    # a where with its operands and result sharded differently, and a row-sharded gather
    # whose result is resharded, keep random bits.
    others = [np.float16, np.float32, np.int8, np.int32, np.uint16, np.bool_,
              ml_dtypes.float8_e4m3fn] + ([np.float64, np.int64] if X64 else []) + \
        SUB_BYTE_DTYPES
    for dt in map(np.dtype, others):
        c = rng.random(shape) > 0.5
        x, y, t = bits(dt, shape), bits(dt, shape), bits(dt, (512, 32))
        i = rng.integers(-2, 514, 64).astype(np.int32)
        zero = np.zeros((), dt)
        for impl in IMPLS:
            @check(f"reshard_dtype[{dt.name},{impl}]")
            def _():
                colls = []
                where = jax.jit(lambda c, x, y: jax_ext.where(c, x, y),
                                out_shardings=NamedSharding(MESH, P(None, "x")))
                gather = jax.jit(lambda t, i: jax_ext.gather(t, [0], 0, i, pad_value=zero),
                                 out_shardings=NamedSharding(MESH, P(None, "x")))
                with jax_ext.implementation(impl):
                    for jf, args, want in (
                            (where, (put(c, MESH, P()), put(x, MESH, P("x", None)),
                                     put(y, MESH, P(None, "x"))), np.where(c, x, y)),
                            (gather, (put(t, MESH, P("x", None)), put(i, MESH, P("x"))),
                             np_gather(t, i, 64, zero, 32))):
                        colls += collectives(jf.lower(*args).compile().as_text())
                        same_bits(jf(*args), want)
                return {"collectives": colls}


# --- packed dtypes: float4's gradient and exports (their forward: forward_checks) ------

def subbyte_checks():
    """float4_e2m1fn's gradient of a table sharded along its rows: float32 sums of the
    cotangent rows in index order, rounded once; the cotangent crosses devices as uint8
    codes (XLA:CPU sums float4 in float16, where -0 comes back +0)."""
    f4 = np.dtype(ml_dtypes.float4_e2m1fn)
    t, ct = bits(f4, (R, C)), bits(f4, (N, C))
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    idx[: N // 4] = idx[N // 4: N // 2]  # repeated rows accumulate
    want = np.zeros((R, C), np.float32)
    for k, i in enumerate(idx):
        if 0 <= i < R:
            want[i] += ct[k].astype(np.float32)
    want = want.astype(f4)  # float32 sums in index order, rounded once
    grad = lambda t, i, c: jax.vjp(lambda t: jax_ext.gather(t, [0], 0, i), t)[1](c)[0]  # noqa: E731
    for impl in IMPLS:
        @check(f"subbyte_grad[float4_e2m1fn,{impl}]")
        def _():
            args = (put(t, MESH, P("x", None)), put(idx, MESH, P("x")), put(ct, MESH, P("x")))
            rec = rows_case(impl, grad, args, want)
            rec.update(table=t.nbytes, result=ct.nbytes, ndev=8)
            return rec


def subbyte_export_checks():
    """A row-sharded gather of each packed dtype exported on both kinds of mesh axes:
    deserialized, it gives the direct jit's bits and sharding. jax serializes no 2-bit
    type (int2, uint2): there, its serialization raises as for jnp.take's program."""
    for dt in map(np.dtype, SUB_BYTE_DTYPES):
        t = bits(dt, (R, C))
        idx = rng.integers(-3, R + 3, N).astype(np.int32)
        for kind, mesh in (("auto", MESH), ("explicit", EMESH)):
            for impl in IMPLS:
                @check(f"subbyte_export[{dt.name},{kind},{impl}]")
                def _():
                    args = (put(t, mesh, P("x", None)), put(idx, mesh, P("x")))
                    jf = jax.jit(lambda t, i: jax_ext.gather(t, [0], 0, i))
                    with jax_ext.implementation(impl):
                        want = jf(*args)
                        exp = jax.export.export(jf, disabled_checks=jax_ext.export_checks())(
                            *args)
                    same_bits(want, np_gather(t, idx, N, np.zeros((), dt), C))
                    if bit_width(dt) == 2:
                        twin = jax.export.export(jax.jit(lambda t: jnp.take(t, idx, axis=0)))(
                            t)
                        for e in (exp, twin):
                            try:
                                e.serialize()
                            except KeyError as err:
                                assert dt.name in str(err), err
                            else:
                                raise AssertionError(f"{dt.name} serialized")
                        got = exp.call(*args)
                    else:
                        got = jax.export.deserialize(exp.serialize()).call(*args)
                    same_bits(got, want)
                    assert _same_spec(got, want), (spec_of(got), spec_of(want))
                    rec = compiled(exp.call, *args)
                    rec.update(spec=spec_of(got), table=t.nbytes, ndev=8, result=want.size)
                    return rec


# --- jax.export of sharded programs: serialized, deserialized, called on the mesh ---------

def _same_spec(a, b):
    return spec_of(a) == spec_of(b)


def export_checks():
    t = bits(BF16, (R, C))
    tf = rng.standard_normal((R, C)).astype(np.float32)
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    w = rng.standard_normal((N, C)).astype(np.float32)
    c = rng.random((R, C)) > 0.5
    y = bits(BF16, (R, C))
    programs = {
        "gather": (lambda t, i: jax_ext.gather(t, [0], 0, i), (t, idx), (P("x", None), P("x")),
                   None),
        "step": (step, (tf, idx, w), (P("x", None), P("x"), P("x", None)), P("x", None)),
        # a bare gradient, no out_shardings: sharded as its table, exported or not
        "grad": (jax.grad(lambda t, i, w: jnp.sum(jax_ext.gather(t, [0], 0, i) * w)),
                 (tf, idx, w), (P("x", None), P("x"), P("x", None)), None),
        "select cols": (lambda c, x, y: jax_ext.select(c, x, y), (c, t, y),
                        (P(None, "x"), P(None, "x"), P(None, "x")), None),
        "where": (lambda c, x, y: jax_ext.where(c, x, y), (c, t, y),
                  (P("x", None), P("x", None), P("x", None)), None),
    }
    for kind, mesh in (("auto", MESH), ("explicit", EMESH)):
        for name, (f, host, specs, out) in programs.items():
            for impl in IMPLS:
                @check(f"export[{name},{kind},{impl}]")
                def _():
                    args = [put(a, mesh, s) for a, s in zip(host, specs)]
                    kw = {} if out is None else {"out_shardings": NamedSharding(mesh, out)}
                    with jax_ext.implementation(impl):
                        jf = jax.jit(f, **kw)
                        want = jf(*args)
                        exp = jax.export.export(jf, disabled_checks=jax_ext.export_checks())(
                            *args)
                    back = jax.export.deserialize(exp.serialize())
                    got = back.call(*args)
                    same_bits(got, want)
                    assert _same_spec(got, want), (spec_of(got), spec_of(want))
                    rec = compiled(back.call, *args)
                    rec.update(spec=spec_of(got), table=host[0].nbytes, ndev=8,
                               result=int(np.prod(want.shape)) * want.dtype.itemsize)
                    return rec


def export_memory_checks():
    """The deserialized program, compiled on the mesh, keeps the direct jit's memory and
    moves no float: forward and bare gradient, the table replicated or sharded along its
    rows, the index sharded, both kinds of mesh axes. A table large enough that holding
    its gradient whole on a device shows."""
    rows, n = 65536, 2048
    t = bits(np.float32, (rows, C))
    idx = rng.integers(-3, rows + 3, n).astype(np.int32)
    idx[::2] = rng.integers(0, 64, n // 2)  # rows that many devices add to
    w = rng.standard_normal((n, C)).astype(np.float32)
    progs = {"forward": lambda t, i, w: jax_ext.gather(t, [0], 0, i),
             "grad": jax.grad(lambda t, i, w: jnp.sum(jax_ext.gather(t, [0], 0, i) * w))}
    for kind, mesh in (("auto", MESH), ("explicit", EMESH)):
        for table, tspec in (("replicated", P()), ("rows", P("x", None))):
            for name, f in progs.items():
                first = {}
                for impl in IMPLS:
                    @check(f"export_memory[{name},{table},{kind},{impl}]")
                    def _():
                        args = [put(a, mesh, s) for a, s in zip((t, idx, w), (
                            tspec, P("x"), P("x", None)))]
                        with jax_ext.implementation(impl):
                            jf = jax.jit(f)
                            direct = jf.lower(*args).compile().memory_analysis()
                            want = jf(*args)
                            exp = jax.export.export(jf, disabled_checks=jax_ext.export_checks())(
                                *args)
                        got = jax.export.deserialize(exp.serialize()).call(*args)
                        same_bits(got, want)
                        same_bits(got, first.setdefault("bits", np.asarray(got)))  # every path
                        assert _same_spec(got, want), (spec_of(got), spec_of(want))
                        rec = compiled(jax.export.deserialize(exp.serialize()).call, *args)
                        rec.update(direct=int(direct.temp_size_in_bytes), table=t.nbytes)
                        return rec


def partitioning_checks():
    """Under jax_partitioning (jax 0.12+: an Explicit mesh's ops lowered through
    shard_map), forward and gradient of a row-sharded table, against the option off."""
    t = np.round(rng.standard_normal((R, C)) * 4).astype(np.float32) + np.float32(0)
    idx = rng.integers(-3, R + 3, N).astype(np.int32)
    args = (put(t, EMESH, P("x", None)), put(idx, EMESH, P("x")))
    f = jax.jit(lambda t, i: jax_ext.gather(t, [0], 0, i))
    g = jax.jit(jax.grad(lambda t, i: jnp.sum(jax_ext.gather(t, [0], 0, i) ** 2)))
    for impl in IMPLS:
        @check(f"jax_partitioning[{impl}]")
        def _():
            with jax.set_mesh(EMESH), jax_ext.implementation(impl):
                want = (f(*args), g(*args))
                jax.config.update("jax_partitioning", True)
                try:
                    got = (f(*args), g(*args))
                    rec = compiled(f, *args)
                finally:
                    jax.config.update("jax_partitioning", False)
            for a, b in zip(got, want):
                same_bits(a, b)
                assert spec_of(a) == spec_of(b), (spec_of(a), spec_of(b))
            rec.update(spec=spec_of(got[0]), table=t.nbytes, result=N * C * 4, ndev=8)
            return rec


# --- update_rows: a training step that costs the rows it touches -----------------------

def _sparse_step(opt):
    """Forward through gather, gradient rows that depend on the rows read, update_rows."""
    def step(t, s, i, w):
        rows = jax_ext.gather(t, [0], 0, i)
        g = jax.grad(lambda r: jnp.sum(r * w) + jnp.sum(r * r) / 4)(rows)
        return jax_ext.update_rows(opt, t, s, [0], 0, i, g)
    return step


def _tree_bits(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        same_bits(np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b)))


def update_rows_checks():
    """update_rows on a table sharded along its rows (auto and explicit axes, a 2-D mesh)
    and on a replicated table with the index sharded: one device's bits for the table and
    every state leaf (ids repeated across devices' blocks, out of range, negative), the
    table and its state kept where they lie (donated: in place), and the collectives and
    per-device memory read from the compiled program."""
    import optax
    n = 512
    t = rng.standard_normal((R, C)).astype(np.float32)
    idx = rng.integers(-3, R + 3, n).astype(np.int32)
    idx[n - 64:] = idx[:64]  # the same rows in the first and the last device's blocks
    w = rng.standard_normal((n, C)).astype(np.float32)
    opts = {"sgd": optax.sgd(0.05), "adagrad": optax.adagrad(0.1), "adam": optax.adam(0.01)}
    layouts = {"rows auto": (MESH, P("x", None), P("x")),
               "rows explicit": (EMESH, P("x", None), P("x")),
               "rows 2d": (MESH2, P("model", None), P("data")),
               "replicated": (MESH, P(), P("x"))}
    cases = [(o, lay) for o in ("sgd", "adagrad") for lay in layouts] + [("adam", "rows auto")]
    one = jax.devices()[0]
    for name, lay in cases:
        opt, (mesh, tspec, ispec) = opts[name], layouts[lay]
        s0 = opt.init(t)
        want = jax.jit(_sparse_step(opt))(*(jax.device_put(a, one) for a in (t, s0, idx, w)))
        for impl in IMPLS:
            @check(f"update[{name},{lay},{impl}]")
            def _():
                leaf = lambda x: put(np.asarray(x), mesh, tspec if x.shape == t.shape else P())  # noqa: E731
                args = (put(t, mesh, tspec), jax.tree.map(leaf, s0), put(idx, mesh, ispec),
                        put(w, mesh, P(*ispec, None)))
                f = jax.jit(_sparse_step(opt), donate_argnums=(0, 1))
                with jax_ext.implementation(impl):
                    rec = compiled_donated(f, *args)
                    rec["explain"] = [d.reason for d in jax_ext.explain(_sparse_step(opt), *args)
                                      if d.op == "update_rows"]
                    out = f(*args)
                _tree_bits(out, want)
                if lay == "replicated":  # every device holds the same, one device's, bits
                    for sh in out[0].addressable_shards:
                        same_bits(sh.data, np.asarray(want[0]))
                rec.update(spec=spec_of(out[0]),
                           state=[spec_of(x) for x in jax.tree.leaves(out[1]) if x.ndim == 2],
                           table=t.nbytes, grads=w.nbytes, ndev=8)
                return rec


def compiled_donated(f, *args):
    c = f.lower(*args).compile()
    m = c.memory_analysis()
    return {"collectives": collectives(c.as_text()), "conversions": conversions(c.as_text()),
            "temp": int(m.temp_size_in_bytes), "alias": int(m.alias_size_in_bytes)}


def update_rows_export_checks():
    """The same step exported, serialized, deserialized and called on the mesh: the
    direct jit's bits and shardings (optax's states are no serializable pytree: flat
    leaves)."""
    import optax
    n = 512
    t = rng.standard_normal((R, C)).astype(np.float32)
    idx = rng.integers(-3, R + 3, n).astype(np.int32)
    idx[n - 64:] = idx[:64]  # the same rows in the first and the last device's blocks
    w = rng.standard_normal((n, C)).astype(np.float32)
    opt = optax.adagrad(0.1)
    s0 = opt.init(t)
    tree = jax.tree.structure(s0)

    def step(t, leaves, i, w):
        t, s = _sparse_step(opt)(t, jax.tree.unflatten(tree, leaves), i, w)
        return t, jax.tree.leaves(s)
    for kind, mesh in (("auto", MESH), ("explicit", EMESH)):
        for impl in IMPLS:
            @check(f"update_export[{kind},{impl}]")
            def _():
                args = (put(t, mesh, P("x", None)),
                        [put(np.asarray(x), mesh, P("x", None) if x.shape == t.shape else P())
                         for x in jax.tree.leaves(s0)],
                        put(idx, mesh, P("x")), put(w, mesh, P("x", None)))
                with jax_ext.implementation(impl):
                    want = jax.jit(step)(*args)
                    exp = jax.export.export(jax.jit(step),
                                            disabled_checks=jax_ext.export_checks())(*args)
                back = jax.export.deserialize(exp.serialize())
                got = back.call(*args)
                _tree_bits(got, want)
                assert spec_of(got[0]) == spec_of(want[0]), (spec_of(got[0]), spec_of(want[0]))
                rec = compiled(back.call, *args)
                rec.update(spec=spec_of(got[0]), table=t.nbytes, grads=w.nbytes, ndev=8)
                return rec


if __name__ == "__main__":
    outdir = sys.argv[1]
    assert len(DEV) == 8, DEV
    for run in (forward_checks, explicit_checks, auto_grad_checks, step_checks, other_checks,
                reshard_checks, subbyte_checks, export_checks, subbyte_export_checks,
                export_memory_checks, update_rows_checks, update_rows_export_checks):
        run()
    if "jax_partitioning" in jax.config.values:  # jax 0.12+
        partitioning_checks()
    with open(os.path.join(outdir, "rows.json"), "w") as fh:
        json.dump(RESULTS, fh)
