"""Export to ONNX (jax_ext.onnx + jax2onnx): every program of the matrix converts to standard
ONNX, onnxruntime and OpenVINO run it, and their outputs equal jax_ext's own results (and
numpy's) bit for bit, at every opset jax2onnx writes. Where OpenVINO itself narrows a dtype
(its CPU plugin computes 64-bit types in 32 bits and float16 in float32), what it does is
named and asserted exactly, so the test notices when it changes. The packages come with the
``test`` extra."""
import dataclasses
import functools
import importlib
import inspect
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest

import jax_ext
from references import (assert_bits_equal, need, np_select, random_values, ref_gather,
                        special_values)

need("onnxruntime", "jax2onnx")  # skipped only where the extras leave them out
import jax_ext.onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from jax2onnx import to_onnx  # noqa: E402
from jax_ext.onnx import _graphs, _plugins  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
DEFAULT_OPSET = inspect.signature(to_onnx).parameters["opset"].default
OPSETS = sorted({DEFAULT_OPSET, 21, 26})  # 26: the first with BitCast, which jax_ext does not use
ONNX_TYPE = {BF16: 16}
JAX_11 = tuple(map(int, jax.__version__.split(".")[:2])) >= (0, 11)  # numpy has no bfloat16 of its own: onnxruntime takes its bits


def export(fn, args, opset=DEFAULT_OPSET):
    """fn converted by jax2onnx. Its enable_double_precision keeps 64-bit inputs 64-bit (else
    int64 becomes int32) but makes every float float64, so it is on only for programs with
    64-bit inputs (and none of float32)."""
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    wide = any(np.asarray(a).dtype.itemsize == 8 for a in args)
    return to_onnx(fn, specs, opset=opset, enable_double_precision=wide)


def _ortvalue(a):
    a = np.require(a, requirements="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    if a.dtype in ONNX_TYPE:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), ONNX_TYPE[a.dtype])
    return ort.OrtValue.ortvalue_from_numpy(a)


def run_ort(model, args, like):
    """onnxruntime's outputs, written into numpy buffers shaped and typed as `like`."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for spec, a in zip(sess.get_inputs(), args):
        io.bind_ortvalue_input(spec.name, _ortvalue(np.asarray(a)))
    outs = [np.empty(np.shape(w), np.asarray(w).dtype) for w in like]
    for spec, buf in zip(sess.get_outputs(), outs):
        io.bind_ortvalue_output(spec.name, _ortvalue(buf))
    sess.run_with_iobinding(io)
    return outs


OPENVINO_CHILD = r"""
import sys, numpy as np, openvino as ov
core = ov.Core()
for path in sys.argv[1:]:
    d = np.load(path, allow_pickle=False)
    model = core.read_model(d["model"].tobytes(), b"")
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    args = []
    for i, port in enumerate(compiled.inputs):
        a = d[f"arg{i}"]
        if port.get_element_type() == ov.Type.bf16:  # its bits, into a bfloat16 tensor
            t = ov.Tensor(ov.Type.bf16, ov.Shape(list(a.shape)))
            t.data.view(np.uint16)[...] = a
            a = t
        args.append(a)
    res = compiled(args)
    np.savez(path + ".out.npz", *[res[o] for o in compiled.outputs])
"""


def _to_openvino(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype == BF16 else a  # OpenVINO reads bfloat16 as its bits


def run_openvino_many(jobs, tmp_path):
    """OpenVINO's outputs for each (model, args, like) in `jobs` (bfloat16 where `like` is),
    from one child process without the sanitizer runtime preloaded: OpenVINO's TBB opens a
    library with RTLD_DEEPBIND, which ASan refuses (the sanitized suite preloads it), and
    OpenVINO runs no jax_ext code to check anyway. ``INFERENCE_PRECISION_HINT: f32`` keeps
    it from computing float32 in a narrower type."""
    need("openvino")
    paths = []
    for k, (model, args, _) in enumerate(jobs):
        path = tmp_path / f"job{k}.npz"
        np.savez(path, model=np.frombuffer(model.SerializeToString(), np.uint8), n=len(args),
                 **{f"arg{i}": _to_openvino(a) for i, a in enumerate(args)})
        paths.append(str(path))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    r = subprocess.run([sys.executable, "-P", "-c", OPENVINO_CHILD, *paths], capture_output=True,
                       text=True, env=env, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    results = []
    for path, (_, _, like) in zip(paths, jobs):
        out = np.load(path + ".out.npz")
        got = [out[f"arr_{i}"] for i in range(len(out.files))]
        results.append([g.view(BF16) if k < len(like) and np.asarray(like[k]).dtype == BF16
                        else g for k, g in enumerate(got)])
    return results


def run_openvino(model, args, tmp_path):
    """OpenVINO's outputs for one model."""
    return run_openvino_many([(model, args, [])], tmp_path)[0]


def jax_results(fn, args):
    out = jax.jit(fn)(*args)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def round_trip(fn, args, opset=DEFAULT_OPSET):
    """(onnxruntime's outputs, jax_ext's) for fn on args."""
    want = jax_results(fn, args)
    return run_ort(export(fn, args, opset), args, want), want


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype != np.bool_ else a


def values(rng, shape, dtype):
    """Random bits with the special values (-0.0, inf, NaN payloads) in the first row."""
    v = random_values(rng, shape, dtype)
    sp = special_values(dtype, v[0].size) if v.ndim else None
    if sp is not None:
        v[0] = sp.reshape(v[0].shape)
    return v


# --- the interface jax_ext uses, and the optional dependency --------------------------------

def test_jax2onnx_interface_is_there():
    """Every piece of jax2onnx's plugin interface that jax_ext.onnx uses still exists, and
    the installed jax2onnx is in the range the extra pins."""
    assert jax_ext.onnx.interface_problems() == []
    lo, hi = _plugins.TESTED
    assert lo <= _plugins.version()[:2] < hi
    assert all(_plugins.registered(p) for p in jax_ext.onnx.PRIMITIVES)
    assert set(jax_ext.onnx.PRIMITIVES) == {"jax_ext_select", "jax_ext_gather",
                                            "jax_ext_scatter_add", "jax_ext_shard_like"}


def test_interface_check_reports_what_moved(monkeypatch):
    monkeypatch.setattr(_plugins, "INTERFACE", _plugins.INTERFACE + (
        ("jax2onnx.plugins.plugin_system", "NoSuchThing", ()),
        ("jax2onnx", "to_onnx", ("no_such_parameter",))))
    problems = jax_ext.onnx.interface_problems()
    assert len(problems) == 2 and "NoSuchThing" in problems[0]
    assert "no_such_parameter" in problems[1]


def _moved_assign_spec():
    @dataclasses.dataclass
    class AssignSpec:
        attr: str
        target: object
        value: object
    return AssignSpec


def _drop_outputs(make_node):
    def _make_node(self, op_type, inputs, kwargs):
        kwargs.pop("_outputs", None)
        return make_node(self, op_type, inputs, kwargs)
    return _make_node


# A jax2onnx release that moves one piece jax_ext uses: (its module, its class or None, its
# name, what it becomes given what it was, the words interface_problems must name it with).
MOVED = {
    "builder.opset": ("jax2onnx.converter.ir_builder", "IRBuilder", "opset",
                      lambda _: property(lambda self: 17, lambda self, v: None), "builder.opset"),
    "_outputs": ("jax2onnx.converter.ir_builder", "_DynamicTapeBuilder", "_make_node",
                 _drop_outputs, "_outputs=[name]"),
    "lower": ("jax2onnx.plugins.plugin_system", "PrimitiveLeafPlugin", "lower",
              lambda _: (lambda self, eqn, ctx: None), "PrimitiveLeafPlugin.lower"),
    "AssignSpec": ("jax2onnx.plugins.plugin_system", None, "AssignSpec",
                   lambda _: _moved_assign_spec(), "AssignSpec has no fields target, attr, value"),
    "name_hint": ("jax2onnx.converter.ir_context", "IRContext", "get_value_for_var",
                  lambda _: (lambda self, var, *, hint=None: None),
                  "get_value_for_var has no name_hint"),
    "fresh_name": ("jax2onnx.converter.ir_context", "IRContext", "fresh_name",
                   lambda _: (lambda self, base: base), "fresh_name gave one name twice"),
    "bind_value_for_var": ("jax2onnx.converter.ir_context", "IRContext", "bind_value_for_var",
                           lambda _: (lambda self, var, value: None), "bind_value_for_var"),
}


@pytest.mark.parametrize("piece", MOVED)
def test_interface_check_names_each_piece(piece, monkeypatch):
    """Each piece of jax2onnx that jax_ext uses, moved as a release could move it: the
    interface check fails naming it (before any user's export would)."""
    module, cls, attr, make, words = MOVED[piece]
    owner = importlib.import_module(module)
    owner = getattr(owner, cls) if cls else owner
    monkeypatch.setattr(owner, attr, make(getattr(owner, attr, None)), raising=False)
    problems = jax_ext.onnx.interface_problems()
    assert len(problems) == 1 and words in problems[0], problems


def test_import_jax_ext_does_not_import_jax2onnx():
    code = "import sys, jax_ext; assert 'jax2onnx' not in sys.modules and 'onnx' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]


# --- select: every front-end x dtype x broadcasting form x opset, in both runtimes ----------

def specials(dtype):
    """Bit patterns a runtime's select could rewrite: -0.0, quiet and signalling NaNs with
    payloads of both signs, infinities, a denormal (floats); the extremes (integers)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.array([True, False] * 4)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array([info.min, info.min + 1, 0, 1, info.max - 1, info.max, info.max // 3,
                         info.min // 3], dt)
    w = dt.itemsize * 8
    if dt == BF16:
        bits = [0x8000, 0x0000, 0xFFC1, 0xFF81, 0x7FC1, 0x7F81, 0xFF80, 0x0001]
    else:
        m = {16: 10, 32: 23, 64: 52}[w]  # mantissa bits
        sign, inf, quiet = 1 << (w - 1), ((1 << (w - 1 - m)) - 1) << m, 1 << (m - 1)
        bits = [sign, 0, sign | inf | quiet | 0x23, sign | inf | 0x11, inf | quiet | 0x45,
                inf | 0x5, sign | inf, 1]
    return np.array(bits, np.uint64).astype(f"u{dt.itemsize}").view(dt)


def scalar_for(dtype):
    """A Python scalar that keeps `dtype` (weak type) and has bits worth keeping."""
    dt = np.dtype(dtype)
    return True if dt == np.bool_ else 1 if dt.kind == "u" else -1 if dt.kind == "i" else -0.0


# name -> (the front-end call on (c, x, y) -> outputs, the shapes of c, x, y, numpy's
# outputs as [(condition, x, y)] broadcast to the result by np_select).
FRONT_ENDS = {
    "select": (lambda c, x, y: [jax_ext.select(c, x, y)], [(6, 1), (2, 6, 16), (6, 16)],
               lambda c, x, y: [(c, x, y)]),
    "select_none": (lambda c, x, y: [jax_ext.select(c, x, y, auto_broadcast="none")],
                    [(6, 8), (6, 8), (6, 8)], lambda c, x, y: [(c, x, y)]),
    "where_3way": (lambda c, x, y: [jax_ext.where(c, x, y)], [(2, 1, 8), (8, 1), (1, 8)],
                   lambda c, x, y: [(c, x, y)]),
    "where_rows_broadcast": (lambda c, x, y: [jax_ext.where(c, x, y)],
                             [(2, 8, 1), (2, 8, 16), (2, 8, 1)], lambda c, x, y: [(c, x, y)]),
    "where3_elementwise": (lambda c, x, y: [jax_ext.where3(c, x, y)], [(6, 8), (6, 8), (6, 8)],
                           lambda c, x, y: [(c, x, y)]),
    "where3_short_rows": (lambda c, x, y: [jax_ext.where3(c, x, y)], [(6,), (6, 4, 2), (6, 4, 2)],
                          lambda c, x, y: [(c[:, None, None], x, y)]),
    "where3_rows": (lambda c, x, y: [jax_ext.where3(c, x, y)], [(6,), (6, 4, 8), (6, 4, 8)],
                    lambda c, x, y: [(c[:, None, None], x, y)]),
    "where3_scalar": (lambda c, x, y: [jax_ext.where3(c, x, y), jax_ext.where3(~c, x, y)],
                      [(), (6, 8), (6, 8)], lambda c, x, y: [(c, x, y), (~c, x, y)]),
    "where_python_scalar": (
        lambda c, x, y: [jax_ext.where(c, x, scalar_for(x.dtype)),
                         jax_ext.where(c, scalar_for(y.dtype), y)],
        [(6, 8), (6, 8), (6, 8)],
        lambda c, x, y: [(c, x, np.asarray(scalar_for(x.dtype), x.dtype)),
                         (c, np.asarray(scalar_for(y.dtype), y.dtype), y)]),
}


# The gather in the same graph: pad rows (out of range, negative) and, for narrow dtypes,
# the padding columns of align_bytes=32, from a table with the special values and a pad
# value of special bits.
GATHER_INDEX = np.array([0, 5, -1, 9, 2, 5], np.int32)


def front_end_inputs(dtype):
    """(c, x, y) for every front-end, then the gather's (table, pad value): x and y start
    with the special values end to end (y's in reverse; three times, or their first two
    rows), random bits after; conditions random but for their first two rows, which
    alternate and are each other's negation, so every special value is taken from both
    sides."""
    rng = np.random.default_rng(53)
    sp, args = specials(dtype), []
    for _, shapes, _ in FRONT_ENDS.values():
        c = rng.integers(0, 2, shapes[0]).astype(bool)
        if c.ndim:
            c[0] = np.arange(c[0].size).reshape(c[0].shape) % 2 == 0
            c[1] = ~c[0]
        args.append(c)
        for shape, vals in ((shapes[1], sp), (shapes[2], sp[::-1])):
            v = random_values(rng, shape, dtype)
            n = min(v.size, max(3 * vals.size, v[:2].size if v.ndim else 1))
            v.flat[:n] = np.resize(vals, n)
            args.append(v)
    table = random_values(rng, (6, 8), dtype)
    table[:3] = np.resize(sp, (3, 8))
    return args + [table, sp[2 % sp.size]]


def front_ends_program(*args):
    outs = []
    for k, (fn, _, _) in enumerate(FRONT_ENDS.values()):
        outs += fn(*args[3 * k:3 * k + 3])
    table, pad = args[-2:]
    return (*outs, jax_ext.gather(table, [0], 0, GATHER_INDEX, pad_value=pad))


def numpy_front_ends(args):
    outs = []
    for k, (_, _, ref) in enumerate(FRONT_ENDS.values()):
        c, x, y = args[3 * k:3 * k + 3]
        for cc, xx, yy in ref(c, x, y):
            shape = np.broadcast_shapes(np.shape(cc), np.shape(xx), np.shape(yy))
            outs.append(np_select(cc, xx, yy, shape))
    table, pad = args[-2:]
    return outs + [ref_gather(table, (0,), 0, GATHER_INDEX, pad_value=pad)]


def output_names():
    return [f"{name}[{i}]" for name, (fn, shapes, ref) in FRONT_ENDS.items()
            for i in range(len(ref(np.ones(shapes[0], bool), np.zeros(1), np.zeros(1))))
            ] + ["gather"]


@functools.lru_cache(maxsize=None)
def front_ends_case(dtype_name, opset):
    """(the exported model, its inputs, jax_ext's outputs) for one dtype and opset: every
    front-end in one graph (converted once, run by both runtimes)."""
    dtype = BF16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
    args = front_end_inputs(dtype)
    want = jax_results(front_ends_program, args)
    assert_outputs(want, numpy_front_ends(args), "jax_ext against numpy (on raw bytes)")
    return export(front_ends_program, args, opset), args, want


def selected_types(model):
    """The element types of the values every Where in the model selects."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    return {types.get(n.input[1]) for n in model.graph.node if n.op_type == "Where"}


def assert_outputs(got, want, what):
    """Every output's bits, failures named by front-end."""
    bad = []
    for name, g, w in zip(output_names(), got, want):
        try:
            assert_bits_equal(np.asarray(g), w)
        except AssertionError as e:
            bad.append(f"{name}: {e}")
    assert not bad, f"{what}:\n" + "\n".join(bad)


def test_special_values_come_from_both_sides():
    """The inputs carry every special value on both sides of every front-end's select (the
    scalar condition's through its two outputs), so an exact run means they all moved."""
    for dtype in DTYPES:
        if np.dtype(dtype) == np.bool_:
            continue
        args, sp = front_end_inputs(dtype), specials(dtype)
        k = 0
        for name, (_, _, ref) in FRONT_ENDS.items():
            c, x, y = args[k:k + 3]
            k += 3  # (the gather's table and pad value follow the selects')
            taken_x, taken_y = set(), set()
            for cc, xx, yy in ref(c, x, y):
                shape = np.broadcast_shapes(np.shape(cc), np.shape(xx), np.shape(yy))
                cb = np.broadcast_to(cc, shape)
                taken_x |= set(_bits(np.broadcast_to(xx, shape)[cb]).tolist())
                taken_y |= set(_bits(np.broadcast_to(yy, shape)[~cb]).tolist())
            sb = set(_bits(sp).tolist())
            if "python_scalar" not in name:
                assert sb <= taken_x and sb <= taken_y, (name, np.dtype(dtype).name)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_front_ends_onnxruntime(dtype, opset):
    """Every front-end and broadcasting form, and a gather, one graph per dtype and opset:
    onnxruntime gives jax_ext's bits, -0.0 and NaN payloads of both signs from both sides
    included."""
    model, args, want = front_ends_case(np.dtype(dtype).name, opset)
    assert selected_types(model) <= {onnx.TensorProto.INT64}  # a Where moves positions only
    assert_outputs(run_ort(model, args, want), want, f"onnxruntime, opset {opset}")


def openvino_expected(want):
    """What OpenVINO 2026.4's CPU plugin makes of jax_ext's bits, for the dtypes it does not
    keep (with ``INFERENCE_PRECISION_HINT: f32``): int64 and uint64 become their low 32 bits,
    sign-extended; float64 becomes float32 and back: rounded, saturated to float32's largest
    finite value beyond it (infinities included), NaNs quieted; a float16 signalling NaN
    comes out quiet (its payload kept: float16 runs as float32). Every other dtype: its
    bits."""
    w = np.asarray(want)
    if w.dtype in (np.int64, np.uint64):
        return w.view(np.int64).astype(np.int32).astype(np.int64).view(w.dtype)
    if w.dtype == np.float64:
        top = float(np.finfo(np.float32).max)
        with np.errstate(invalid="ignore"):
            return np.clip(w, -top, top).astype(np.float32).astype(np.float64)
    if w.dtype == np.float16:
        b = w.view(np.uint16)
        snan = ((b & 0x7C00) == 0x7C00) & ((b & 0x3FF) != 0)
        return np.where(snan, b | 0x200, b).astype(np.uint16).view(np.float16)
    return w


@pytest.mark.parametrize("opset", OPSETS)
def test_front_ends_openvino(opset, tmp_path):
    """The same graphs, every dtype, in OpenVINO (one child process for all): jax_ext's bits
    where OpenVINO keeps the dtype, and exactly its own narrowing where not."""
    names = [np.dtype(d).name for d in DTYPES]
    cases = [front_ends_case(n, opset) for n in names]
    results = run_openvino_many([(m, a, w) for m, a, w in cases], tmp_path)
    bad = []
    for name, (_, _, want), got in zip(names, cases, results):
        try:
            assert_outputs(got, [openvino_expected(w) for w in want], name)
        except AssertionError as e:
            bad.append(str(e))
    assert not bad, f"OpenVINO, opset {opset}:\n" + "\n".join(bad)


def test_plain_where_switch(tmp_path):
    """Under plain_where() the dtypes onnxruntime has a Where kernel for export as one Where
    (values equal in onnxruntime and OpenVINO: the runtimes' own operator), the others keep
    the exact graph; outside the block, no value goes through a Where."""
    c = np.array([[True, False, True, False]] * 3)
    fn = lambda c, x, y: jax_ext.where(c, x, y)
    jobs = []
    for dtype in (np.float16, np.float32, np.float64, np.int32, np.uint16, BF16, np.bool_):
        x = specials(dtype)[:4][None].repeat(3, 0)
        y = specials(dtype)[4:][None].repeat(3, 0)
        with jax_ext.onnx.plain_where():
            model = export(fn, (c, x, y))
        ops = {n.op_type for n in model.graph.node}
        plain = np.dtype(dtype).name in _graphs.PLAIN_WHERE
        assert ("Where" in ops) == plain and ("GatherElements" in ops) != plain, (dtype, ops)
        assert selected_types(export(fn, (c, x, y))) <= {onnx.TensorProto.INT64}
        want = np_select(c, x, y, c.shape)
        (got,) = run_ort(model, (c, x, y), [want])
        if plain:
            np.testing.assert_array_equal(got, want)  # values (NaN == NaN here)
        else:
            assert_bits_equal(got, want)
        jobs.append((model, (c, x, y), [want]))
    for (_, _, (want,)), (got,) in zip(jobs, run_openvino_many(jobs, tmp_path)):
        np.testing.assert_array_equal(got, openvino_expected(want))
    assert not _graphs._PLAIN.get()  # the block ended


def test_plain_where_rewrites_what_onnxruntime_rewrites():
    """Why the exact graph is the default: onnxruntime's Where (under plain_where) turns a
    -0.0 taken from x into +0.0, and every float16 NaN into 0x7e00. If onnxruntime stops
    doing so, this fails and the guide's table needs updating."""
    c = np.array([True, False])
    fn = lambda c, x, y: jax_ext.where(c, x, y)
    with jax_ext.onnx.plain_where():
        for dt in (np.float16, np.float32, np.float64):
            x = np.array([-0.0, 1.0], dt)
            (got,) = run_ort(export(fn, (c, x, x[::-1].copy())), (c, x, x[::-1].copy()), [x])
            assert not np.signbit(got[0]), dt
        nan = np.array([0x7C01, 0x7E01], np.uint16).view(np.float16)
        args = (c, nan, nan[::-1].copy())
        (got,) = run_ort(export(fn, args), args, [nan])
    assert _bits(got).tolist() == [0x7E00, 0x7E00]  # from x and from y: the payload is lost


# --- select: broadcast patterns, front-ends, vmap --------------------------------------------

SELECT_CASES = {
    "select_oneway_cond": (lambda c, x, y: jax_ext.select(c, x, y), [(3, 1, 5), (2, 3, 4, 5), (4, 5)]),
    "select_scalar_else": (lambda c, x, y: jax_ext.select(c, x, y), [(4, 5), (4, 5), ()]),
    "where_0d": (lambda c, x, y: jax_ext.where(c, x, y), [(), (), ()]),
    "vmap_where3_rows": (jax.vmap(lambda c, x, y: jax_ext.where3(c, x, y), in_axes=(1, 0, None)), [(3, 2), (2, 3, 4), (3, 4)]),
    "vmap_select_axes": (jax.vmap(lambda c, x, y: jax_ext.select(c, x, y), in_axes=(None, 2, 0), out_axes=1), [(4,), (3, 4, 5), (5, 3, 4)]),
    "vmap_nested": (jax.vmap(jax.vmap(lambda c, x, y: jax_ext.where(c, x, y), in_axes=(0, None, 0)), in_axes=(None, 0, 1)), [(3, 4), (2, 4), (3, 2, 4)]),
}


@pytest.mark.parametrize("dtype", [np.int32, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", SELECT_CASES)
def test_select_patterns(case, dtype):
    fn, shapes = SELECT_CASES[case]
    rng = np.random.default_rng(3)
    c = rng.integers(0, 2, shapes[0]).astype(bool)
    x, y = (values(rng, s, dtype) for s in shapes[1:])
    (got,), (want,) = round_trip(fn, (c, x, y))
    assert_bits_equal(got, want)


def test_select_grad_and_jvp():
    """The JVP's zero tangents (broadcast along dims no operand spans: an Expand) and the
    transpose's sums, in one exported gradient."""
    def f(c, x, y):
        return jax.grad(lambda x, y: (jax_ext.where(c, x * 3.0, y) ** 2).sum(), (0, 1))(x, y)
    rng = np.random.default_rng(0)
    args = (rng.integers(0, 2, (1, 8)).astype(bool), rng.normal(size=(4, 8)).astype(np.float32),
            rng.normal(size=(1, 8)).astype(np.float32))
    got, want = round_trip(f, args)
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    jvp = lambda c, x, y: jax.jvp(lambda y: jax_ext.where(c, x, y), (y,), (y * 2,))[1]
    (got,), (want,) = round_trip(jvp, args)
    assert_bits_equal(got, want)


# --- gather ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gather_every_dtype(dtype):
    """Out-of-range and negative rows, the padded last dim of align_bytes=32, a pad value
    with special bits: every element moves by Gather, so no dtype loses a bit."""
    rng = np.random.default_rng(1)
    src = values(rng, (7, 5), dtype)
    wide = np.dtype(dtype).itemsize == 8
    idx = np.array([0, 6, -1, 7, 3, 3, 2**40 if wide else 2**30], np.int64 if wide else np.int32)
    pad = src[0, 0]
    fn = lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p)
    (got,), (want,) = round_trip(fn, (src, idx, pad))
    assert_bits_equal(got, want)
    assert_bits_equal(want, ref_gather(src, [0], 0, idx, pad_value=pad))


GATHER_CASES = {
    "dim1_offsets": dict(shape=(3, 6, 2, 5), dim=1, offsets=(1, 2), index=[0, 3, -3, 4, 9]),
    "dim1_offset_out_of_range": dict(shape=(3, 6, 5), dim=1, offsets=(3, 0), index=[0, 1]),
    "no_align": dict(shape=(6, 5), dim=0, offsets=(0,), index=[5, -1, 2], align_bytes=None),
    "align_64": dict(shape=(6, 3), dim=0, offsets=(2,), index=[0, 1, 4], align_bytes=64),
    "num_indices_static": dict(shape=(6, 5), dim=0, offsets=(0,), index=[1, 2, 3, 4], num_indices=2),
    "pad_value_static": dict(shape=(6, 5), dim=0, offsets=(0,), index=[1, 9], pad_value=-3.5),
    "no_bounds_check": dict(shape=(6, 5), dim=0, offsets=(1,), index=[0, 7, -4, 2], check_bounds=False),
    "no_bounds_check_dim1": dict(shape=(2, 6, 5), dim=1, offsets=(5, -2), index=[0, 9], check_bounds=False),
    "index_uint8": dict(shape=(6, 5), dim=0, offsets=(0,), index=np.array([0, 200, 5], np.uint8)),
    "index_int16": dict(shape=(6, 5), dim=0, offsets=(0,), index=np.array([-2, 1, 5], np.int16)),
    "empty_index": dict(shape=(6, 5), dim=0, offsets=(0,), index=np.zeros(0, np.int32)),
}


@pytest.mark.parametrize("case", GATHER_CASES)
def test_gather_options(case):
    kw = dict(GATHER_CASES[case])
    shape, dim, offsets = kw.pop("shape"), kw.pop("dim"), kw.pop("offsets")
    index = np.asarray(kw.pop("index"))
    index = index.astype(np.int32) if index.dtype == np.int64 else index
    src = values(np.random.default_rng(2), shape, np.float32)
    fn = lambda s, i: jax_ext.gather(s, list(offsets), dim, i, **kw)
    (got,), (want,) = round_trip(fn, (src, index))
    assert_bits_equal(got, want)
    if kw.get("check_bounds", True):
        assert_bits_equal(want, ref_gather(src, offsets, dim, index, **kw))


def test_gather_traced_operands():
    """offsets, num_indices and pad_value given as graph inputs."""
    fn = lambda s, o0, o1, i, k, p: jax_ext.gather(s, [o0, o1], 1, i, num_indices=k,
                                                   pad_value=p)
    src = values(np.random.default_rng(4), (3, 6, 5), np.float32)
    idx = np.array([0, 1, -1, 5, 2], np.int32)
    for o0, k in ((1, 4), (-1, 5), (2, 0), (0, 9)):
        args = (src, np.int32(o0), np.int32(1), idx, np.int32(k), np.float32(-0.0))
        (got,), (want,) = round_trip(fn, args)
        assert_bits_equal(got, want)
        assert_bits_equal(want, ref_gather(src, (o0, 1), 1, idx, num_indices=k,
                                           pad_value=np.float32(-0.0)))


GATHER_VMAPS = {
    "src_index": ((0, None, 0, None, None), [(2, 6, 5), None, (2, 4), None, None]),
    "index_only": ((None, None, 0, None, None), [(6, 5), None, (3, 4), None, None]),
    "pad_only": ((None, None, None, None, 0), [(6, 5), None, (4,), None, (3,)]),
    "num_and_offsets": ((None, 0, None, 0, None), [(6, 5), (3, 1), (4,), (3,), None]),
    "all_axis1": ((1, None, 1, None, 0), [(6, 2, 5), None, (4, 2), None, (2,)]),
}


@pytest.mark.parametrize("case", GATHER_VMAPS)
def test_gather_vmap(case):
    axes, shapes = GATHER_VMAPS[case]
    rng = np.random.default_rng(5)
    defaults = [(6, 5), (1,), (4,), (), ()]
    shapes = [s if s is not None else d for s, d in zip(shapes, defaults)]
    src = values(rng, shapes[0], np.float32)
    offs = rng.integers(-1, 3, shapes[1]).astype(np.int32)
    idx = rng.integers(-2, 8, shapes[2]).astype(np.int32)
    num = rng.integers(0, 5, shapes[3]).astype(np.int32)
    pad = rng.normal(size=shapes[4]).astype(np.float32)
    fn = jax.vmap(lambda s, o, i, k, p: jax_ext.gather(s, o, 0, i, num_indices=k, pad_value=p),
                  in_axes=axes)
    (got,), (want,) = round_trip(fn, (src, offs, idx, num, pad))
    assert_bits_equal(got, want)


def test_gather_vmap_nested():
    fn = jax.vmap(jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i), in_axes=(None, 0)),
                  in_axes=(0, 1))
    src = values(np.random.default_rng(6), (2, 6, 5), np.float32)
    idx = np.array([[0, 5, -1], [1, 2, 9], [3, 3, 3]], np.int32).reshape(3, 1, 3)
    idx = np.broadcast_to(idx, (3, 2, 3)).copy()
    (got,), (want,) = round_trip(fn, (src, idx))
    assert_bits_equal(got, want)


# --- scatter-add: gradients and a training step ------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_gather_grad(dtype):
    """The gradient for src is a scatter-add: duplicates accumulate (float16 and bfloat16
    in float32, rounded once), pad rows and padding columns add nothing."""
    wide = np.float32 if np.dtype(dtype).itemsize < 4 else dtype  # the loss's arithmetic

    def f(s, i):
        loss = lambda s: (jax_ext.gather(s, [0], 0, i, pad_value=1.0).astype(wide) ** 2).sum()
        return jax.grad(loss)(s)
    rng = np.random.default_rng(8)
    src = rng.normal(size=(6, 5)).astype(dtype)
    idx = np.array([1, 1, 1, -1, 5, 7, 0, 1], np.int64 if dtype == np.float64 else np.int32)
    (got,), (want,) = round_trip(f, (src, idx))
    assert_bits_equal(got, want)


def test_pad_value_gradient():
    """The gradient for pad_value is jax_ext's own jnp code (a mask of the padded
    positions), which jax2onnx 0.17 converts with its own plugins: on jax 0.10 exactly (pad
    rows, an out-of-range row and the padding columns of align_bytes); on jax >= 0.11 not
    at all (its jnp.where conversion looks for jax._src.core.ClosedJaxpr). The docs say so;
    this notices when it changes."""
    def f(s, i, p):
        return jax.grad(lambda p: jax_ext.gather(s, [0], 0, i, pad_value=p).sum())(p)
    args = (np.ones((6, 5), np.float32), np.array([1, -1, 6, 0], np.int32), np.float32(0.5))
    if JAX_11:
        with pytest.raises(AttributeError, match="ClosedJaxpr"):
            export(f, args)
        return
    (got,), (want,) = round_trip(f, args)
    assert_bits_equal(got, want)
    assert float(want) == 2 * 8 + 2 * 3  # two pad rows of 8, three padding columns of two


@pytest.mark.parametrize("case", ["src_index", "index_only", "all_axis1"])
def test_gather_grad_vmap(case):
    """Batched scatter-adds: one cotangent row per batch element, and src broadcast over
    the batch (its gradient sums over it)."""
    axes, shapes = GATHER_VMAPS[case]
    shapes = [s if s is not None else d for s, d in zip(shapes, [(6, 5), (1,), (4,), (), ()])]
    rng = np.random.default_rng(9)
    src = rng.normal(size=shapes[0]).astype(np.float32)
    idx = rng.integers(-2, 8, shapes[2]).astype(np.int32)
    g = jax.vmap(lambda s, i: jax_ext.gather(s, [0], 0, i), in_axes=(axes[0], axes[2]))
    fn = jax.grad(lambda s, i: (g(s, i) ** 2).sum())
    (got,), (want,) = round_trip(fn, (src, idx))
    assert_bits_equal(got, want)


def sgd_step(table, w, ids, mask, target):
    """An embedding lookup (padded rows), a masked select, a linear layer: one SGD step.
    The layer is written as a product and a sum: jax2onnx 0.17's Gemm for the gradient of
    `h @ w` is rejected by onnxruntime (for the jnp twin too)."""
    def loss(table, w):
        rows = jax_ext.gather(table, [0], 0, ids, align_bytes=None)
        h = jax_ext.where(mask[:, None], rows, 0.0)
        return (((h[:, :, None] * w[None]).sum(1) - target) ** 2).mean()
    value, (gt, gw) = jax.value_and_grad(loss, (0, 1))(table, w)
    return value, table - 0.1 * gt, w - 0.1 * gw


def test_training_step():
    """The step's arithmetic (products, sums, the mean) is onnxruntime's own and rounds
    its own way; jax_ext's ops in it move values exactly (tested above)."""
    rng = np.random.default_rng(10)
    args = (rng.normal(size=(10, 4)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32),
            np.array([0, 3, 3, 12, -1, 9], np.int32), np.array([1, 1, 0, 1, 1, 1], bool),
            rng.normal(size=(6, 2)).astype(np.float32))
    got, want = round_trip(sgd_step, args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_inside_scan():
    """A lax.scan body: an ONNX Loop subgraph, where the constants are nodes."""
    take = lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None)
    scanned = lambda s, i: jax.lax.scan(
        lambda acc, k: (acc + take(s, k[None]).sum(dtype=np.int32), None), np.int32(0), i)[0]
    args = (np.arange(30, dtype=np.int32).reshape(6, 5), np.array([1, 9, 2], np.int32))
    (got,), (want,) = round_trip(scanned, args)  # integer sums: exact anywhere
    assert_bits_equal(got, want)


def test_inside_nested_jit():
    """A nested jax.jit. jax2onnx 0.17 converts none on jax >= 0.11 (it looks for
    jax._src.core.ClosedJaxpr), the jnp twin's neither; the docs list it, and this notices
    when it changes."""
    take = lambda s, i: jax_ext.gather(s, [0], 0, i, align_bytes=None)
    nested = jax.jit(lambda s, i, c: jax_ext.where3(c, take(s, i), -take(s, i)))
    twin = jax.jit(lambda s, i, c: jnp.where(c[:, None], s[i % 6], -s[i % 6]))
    src = values(np.random.default_rng(13), (6, 5), np.float32)
    args = (src, np.array([1, 9, 2], np.int32), np.array([True, False, True]))
    if JAX_11:
        for fn in (nested, twin):
            with pytest.raises(AttributeError, match="ClosedJaxpr"):
                export(fn, args)
        return
    (got,), (want,) = round_trip(nested, args)
    assert_bits_equal(got, want)


def test_eager_calls_before_and_after_an_export():
    """jax2onnx replaces jax.numpy's functions while it traces. The front-ends' eager jit
    is off then: an export leaves no replacement in jit's cache for the eager calls after
    it (same shapes, list offsets, a Python scalar pad: every input jit would otherwise
    trace), nor uses what those calls put there (the second export is the first's)."""
    def fn(s, i, m):
        rows = jax_ext.gather(s, [0], 0, i, pad_value=-1.0)
        return jax_ext.where(m[:, None], rows, np.float32(0.0))
    src = values(np.random.default_rng(14), (7, 3), np.float32)  # shapes no other test uses
    args = (src, np.array([0, 6, 9, -1, 2], np.int32), np.array([True, True, True, False, True]))
    model = export(fn, args)
    assert jax_ext._eager.ENABLED  # back on once the export is done
    with jax.enable_x64(False):  # as the export traced (it turns x64 off)
        eager = np.asarray(fn(*args))
    rows = ref_gather(src, (0,), 0, args[1], pad_value=np.float32(-1.0))
    assert_bits_equal(eager, np_select(args[2][:, None], rows, np.float32(0.0), rows.shape))
    (got,) = run_ort(model, args, [eager])
    assert_bits_equal(got, eager)
    assert export(fn, args).SerializeToString() == model.SerializeToString()


# --- symbolic batch dimensions ----------------------------------------------------------------

def test_symbolic_batch():
    """One exported model serves every batch size: where over ("B", 8), gather of ("N",)
    indices from a ("R", 8) table, and a bfloat16 where whose (1, 8) operand is broadcast
    along "B" by a Gather (onnxruntime has no bfloat16 Expand)."""
    fn = lambda c, x, t, i, xb, yb: (jax_ext.where(c, x, 0.0), jax_ext.gather(t, [0], 0, i),
                                     jax_ext.where(c, xb, yb))
    model = to_onnx(fn, [jax.ShapeDtypeStruct(s, d) for s, d in (
        (("B", 8), np.bool_), (("B", 8), np.float32), (("R", 8), np.float32),
        (("N",), np.int32), (("B", 1), BF16), ((1, 8), BF16))])
    rng = np.random.default_rng(11)
    for b, r, n in ((2, 5, 3), (7, 3, 9)):
        args = (rng.integers(0, 2, (b, 8)).astype(bool), values(rng, (b, 8), np.float32),
                values(rng, (r, 8), np.float32), rng.integers(-2, r + 2, n).astype(np.int32),
                values(rng, (b, 1), BF16), values(rng, (1, 8), BF16))
        want = jax_results(fn, args)
        got = run_ort(model, args, want)
        for g, w in zip(got, want):
            assert_bits_equal(g, w)


# --- errors ---------------------------------------------------------------------------------

def test_unsupported_dtype_is_a_clear_error():
    c = jax.ShapeDtypeStruct((3,), np.bool_)
    x = jax.ShapeDtypeStruct((3,), np.complex64)
    with pytest.raises(Exception, match="select of dtype complex64 has no ONNX export"):
        to_onnx(lambda c, x: jax_ext.where(c, x, x), [c, x])


# --- OpenVINO ---------------------------------------------------------------------------------

OPENVINO_CASES = {
    "where_broadcast": (lambda c, x, y: jax_ext.where(c, x, y), lambda r: (
        r.integers(0, 2, (4, 1)).astype(bool), r.normal(size=(4, 8)).astype(np.float32),
        r.normal(size=(1, 8)).astype(np.float32))),
    "where3_rows_int32": (lambda c, x, y: jax_ext.where3(c, x, y), lambda r: (
        r.integers(0, 2, (4,)).astype(bool), r.integers(-9, 9, (4, 3)).astype(np.int32),
        r.integers(-9, 9, (4, 3)).astype(np.int32))),
    "gather_padded": (lambda s, i, p: jax_ext.gather(s, [0], 0, i, pad_value=p), lambda r: (
        r.normal(size=(6, 5)).astype(np.float32), np.array([0, 5, -1, 9, 2], np.int32),
        np.float32(-2.0))),
    "gather_grad": (jax.grad(lambda s, i: (jax_ext.gather(s, [0], 0, i) ** 2).sum()), lambda r: (
        r.normal(size=(6, 5)).astype(np.float32), np.array([1, 1, -1, 5], np.int32))),
    "training_step": (sgd_step, lambda r: (
        r.normal(size=(10, 4)).astype(np.float32), r.normal(size=(4, 2)).astype(np.float32),
        np.array([0, 3, 3, 12, -1, 9], np.int32), np.array([1, 1, 0, 1, 1, 1], bool),
        r.normal(size=(6, 2)).astype(np.float32))),
}


@pytest.mark.parametrize("case", OPENVINO_CASES)
def test_openvino_runs_the_export(case, tmp_path):
    """OpenVINO's CPU plugin reads the exported model and returns jax_ext's values: bit
    for bit where values only move; the training step's arithmetic within float32
    rounding (OpenVINO fuses and reorders the matmul and the mean)."""
    fn, make = OPENVINO_CASES[case]
    args = make(np.random.default_rng(12))
    want = jax_results(fn, args)
    got = run_openvino(export(fn, args), args, tmp_path)
    for g, w in zip(got, want):
        if case == "training_step":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        else:
            assert_bits_equal(np.asarray(g).astype(w.dtype), w)


def test_speed_script_runs(capsys):
    """The guide's speed table's command, on small arrays: it checks every side's outputs
    against jax_ext's (the exact export's bits) before timing, and prints the table."""
    from jax_ext.bench import onnx_export
    assert onnx_export.main(["--quick", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("| where ") == 2 and "| embedding " in out
