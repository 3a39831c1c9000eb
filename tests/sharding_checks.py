"""The multi-device checks of test_sharding.py, run in a child process that was started
with XLA_FLAGS=--xla_force_host_platform_device_count=4 (jax fixes the device count when
its backends start, so the rest of the suite keeps one device).

    python tests/sharding_checks.py run OUTDIR    # every check; OUTDIR/results.json,
                                                  # OUTDIR/*.bin (serialized exports)
    python tests/sharding_checks.py load OUTDIR   # a fresh process: deserialize, call

Each check records {ok, error, collectives, targets, spec} under its name. "collectives"
and "targets" come from the compiled HLO (jit(f).lower(...).compile().as_text()).
"""
import json
import os
import re
import sys
import traceback

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.config.update("jax_enable_x64", True)  # gather's offsets and counts are int64

import jax_ext  # noqa: E402  (registers the FFI targets)

COLL = re.compile(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
                  r"(?:-start)?\(")
TARGET = re.compile(r'custom_call_target="([^"]+)"')
RESULTS = {}


def compiled_info(f, *args):
    text = f.lower(*args).compile().as_text()
    return sorted(set(COLL.findall(text))), sorted(set(TARGET.findall(text))), text


def check(name):
    def deco(fn):
        try:
            rec = fn() or {}
            rec.setdefault("ok", True)
        except Exception as e:  # recorded, asserted by the parent
            rec = {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        RESULTS[name] = rec
        return fn
    return deco


def same_bits(got, want):
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
MESHES = {"auto": Mesh(np.array(DEV), ("x",)), "explicit": jax.make_mesh((4,), ("x",))}
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
            assert "jax_ext_gather_v1" in rec["targets"], rec
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
        for t in ("jax_ext_select_v1", "jax_ext_scatter_add_v1"):  # the primal gather is dead
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
        assert {"jax_ext_select_v1", "jax_ext_gather_v1"} <= set(targets), targets
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


# --- jax.export -------------------------------------------------------------------------

def exported_fn(c, x, y, s, i):
    return jax_ext.where(c, x, y) * 2.0, jax_ext.gather(s, [0], 0, i, pad_value=7.0)


EXPORT_ARGS = (c_rows, x, y_row, src, idx)
EXPORT_SPECS = (P("x", None), P("x", None), P(), P(), P("x"))


def export_want():
    return (np.where(c_rows, x, y_row) * np.float32(2.0),
            np_gather(src, [0], idx, N, 7.0, 0, 8))


@check("export_needs_export_checks")
def _():
    try:
        jax.export.export(jax.jit(exported_fn))(*EXPORT_ARGS)
    except ValueError as e:
        assert "jax_ext_select_v1" in str(e) or "custom call" in str(e).lower(), e
    else:
        raise AssertionError("export without jax_ext.export_checks() should be refused")


def run_export(outdir):
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
        assert "CustomSPMDPartitioning" not in text  # exported unpartitioned (replicated)
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
            assert {"jax_ext_select_v1", "jax_ext_gather_v1"} <= set(targets), targets
            return {"collectives": colls, "targets": targets}


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
    assert len(DEV) == 4, f"needs 4 devices (XLA_FLAGS), got {len(DEV)}"
    if mode == "run":
        run_local_checks()
        run_export(outdir)
        run_gspmd()
        name = "results.json"
    else:
        RESULTS.clear()
        load_exports(outdir)
        name = "load.json"
    with open(os.path.join(outdir, name), "w") as f:
        json.dump(RESULTS, f, indent=1)
