"""A table sharded along its rows stays sharded: forward, training step, vmap, offsets into
sharded dims before `dim`, a 2-D mesh, uneven shards, explicit axes; and every op's
operands, sharded differently, keep their bits through the reshards. Every check runs
under "native", "lax" and "auto" on 8 forced host devices, in a child process
(tests/row_sharding_checks.py), and is asserted here: bits (in the child, against numpy
or the one-device program), compiled collectives and per-device memory.

Targets (issue "sharded the way big models shard"): per-device temp for a forward at most
table/n + 4 x result + 1 MiB, for a training step that plus table/n; no collective as large
as half the table; a forward's collectives together at most 4 x the result; every
collective that carries a table value moves unsigned integers."""
import json
import os
import subprocess
import sys

import jax
import pytest

import jax_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SLACK = 2 ** 16  # the issue allows 1 MiB beyond; these tables are small, so 64 KiB here
FLOATS = ("f16", "bf16", "f32", "f64", "f8e5m2", "f8e4m3fn")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    if not jax_ext.native_available():
        pytest.skip("the compiled module is not installed: nothing to partition")
    out = tmp_path_factory.mktemp("rows")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip()
    env.pop("JAX_EXT_IMPL", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "row_sharding_checks.py"),
                           str(out)], env=env, cwd=HERE, capture_output=True, text=True,
                          timeout=900)
    path = out / "rows.json"
    if proc.returncode != 0 or not path.exists():
        pytest.fail(f"row_sharding_checks.py failed (rc {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(path.read_text())


def _names(prefix):
    """The check names the child records under `prefix`, as the child builds them (so a
    check the child no longer makes fails here as missing)."""
    impls = ("native", "lax", "auto")
    if prefix == "forward":
        return [f"forward[{dt},{shape},{how},{i}]" for dt in ("float32", "bfloat16", "float8_e5m2")
                for shape, how in (("4096x256", "index sharded"), ("4096x256", "index replicated"),
                                   ("4091x250", "index sharded")) for i in impls]
    if prefix == "step":
        return [f"step[{dt},{shape},{i}]" for dt in ("float32", "bfloat16")
                for shape in ("4096x256", "4091x250", "4096x4096") for i in impls]
    if prefix == "explicit":
        return [f"explicit_forward[{m},{i}]" for m in ("set_mesh", "no set_mesh")
                for i in impls] + [f"explicit_grad[{i}]" for i in impls]
    if prefix == "other":
        return [f"{c}[{i}]" for c in ("vmap", "vmap_indices", "mesh2d_dims_before_dim")
                for i in impls] + [f"jax_partitioning[{i}]" for i in impls
                                   if "jax_partitioning" in jax.config.values]
    if prefix == "export":
        return [f"export[{p},{k},{i}]" for p in ("gather", "step", "grad", "select cols",
                                                 "where")
                for k in ("auto", "explicit") for i in impls]
    return [f"reshard[{op},{dt},{how},{i}]" for dt in ("bfloat16", "float8_e5m2")
            for op, hows in (("where", ("out free", "out resharded")),
                             ("select", ("out free", "out resharded")),
                             ("where3", ("out free", "out resharded")),
                             ("gather", ("out resharded",)))
            for how in hows for i in impls]


def _get(rows, name):
    assert name in rows, f"{name} was not run"
    rec = rows[name]
    assert rec["ok"], rec.get("error")
    return rec


def _copies(rec, limit):
    """The buffers of more than `limit` bytes the program copies only to change their
    type (a device's own block of the result or the cotangent, converted to wire values
    before a collective, is below it)."""
    return [b for b in rec["conversions"] if b > limit]


def _float_collectives(rec):
    return [c for c in rec["collectives"] if c[1] in FLOATS]


@pytest.mark.parametrize("name", _names("forward") + _names("explicit") + _names("other"))
def test_forward_keeps_the_table_sharded(rows, name):
    rec = _get(rows, name)
    table, result, n = rec["table"], rec["result"], rec["ndev"]
    sizes = [c[2] for c in rec["collectives"]]
    assert not any(s >= table / 2 for s in sizes), rec["collectives"]  # never the table
    assert not _float_collectives(rec), rec["collectives"]  # integers only
    if "grad" in name:
        assert rec["spec"][0] == "x", rec  # the gradient keeps the table's sharding
        assert rec["temp"] <= 2 * table / n + 4 * result + SLACK, rec
        assert any("the gradient stays sharded along its rows (x)" in r
                   for r in rec["explain"]), rec["explain"]
        return
    if name.startswith(("forward", "explicit_forward")):  # explain() says which way
        assert len(rec["explain"]) == 1 and "the table stays sharded along its rows (x)" \
            in rec["explain"][0], rec["explain"]
    assert sum(sizes) <= 4 * result, rec["collectives"]
    assert rec["temp"] <= table / n + 4 * result + SLACK, rec
    if name.startswith(("forward", "explicit_forward")):
        # The rows a kernel gathers go to the combine as they are, with no copy to change
        # their type (the kernel writes the wire values: pad_value's dtype). (Elsewhere
        # XLA reshards the result after the call, which crosses as wire values too.)
        assert not _copies(rec, 2 * result / n), rec["conversions"]


@pytest.mark.parametrize("impl", ["native", "lax", "auto"])
@pytest.mark.parametrize("case,spec", [("1d", ["x", None]), ("2d", ["model", "data"]),
                                       ("vmap", [None, "x", None])])
def test_a_bare_grad_on_auto_axes_comes_back_sharded_as_its_table(rows, case, spec, impl):
    """jax.grad of a row-sharded table on auto mesh axes, no out_shardings given: each
    device holds its shard of the gradient (not the whole of it, as jnp.take's gradient
    comes back), accumulated there with the bits of one device's (asserted in the child
    against numpy and the jnp twin)."""
    rec = _get(rows, f"auto_grad[{case},{impl}]")
    table, result, n = rec["table"], rec["result"], rec["ndev"]
    assert rec["spec"] == spec, rec["spec"]
    assert rec["out"] == table // n, rec  # the gradient's shard, not the table
    assert rec["temp"] <= table / n + 4 * result + SLACK, rec
    assert not any(c[2] >= table / 2 for c in rec["collectives"]), rec["collectives"]
    assert not _float_collectives(rec), rec["collectives"]
    assert any("the gradient stays sharded along its rows" in r
               for r in rec["explain"]), rec["explain"]


@pytest.mark.parametrize("impl", ["native", "lax", "auto"])
def test_a_result_as_large_as_the_table_copies_it_and_explain_says_so(rows, impl):
    """As many indices as rows, the result replicated: combining the rows would move twice
    the table, so the table is all-gathered (as unsigned integers), and explain() says
    why."""
    rec = _get(rows, f"copied[{impl}]")
    assert [tuple(c[:2]) for c in rec["collectives"]] == [("all-gather", "u32")], rec["collectives"]
    assert len(rec["explain"]) == 1 and "is copied to every device (1 MiB): fewer bytes " \
        "than combining the rows (about 2 MiB)" in rec["explain"][0], rec["explain"]


@pytest.mark.parametrize("name", _names("step"))
def test_training_step_keeps_the_table_sharded_with_one_devices_bits(rows, name):
    rec = _get(rows, name)  # the child compared the updated table with one device's
    table, result, n = rec["table"], rec["result"], rec["ndev"]
    assert rec["spec"][0] == "x", rec
    # The cotangent rows cross devices (result-sized); the table never does.
    assert not any(c[2] >= table / 2 and c[2] > result for c in rec["collectives"]), rec
    assert not _float_collectives(rec), rec["collectives"]
    assert rec["temp"] <= 2 * table / n + 4 * result + SLACK, rec
    # The kernel reads the gathered cotangent's wire values as they came (no copy back to
    # floats: scatter-add's wire_of), and writes the rows the table's update reads.
    assert not _copies(rec, 2 * result / n), rec["conversions"]


@pytest.mark.parametrize("name", _names("reshard"))
def test_bits_survive_every_reshard(rows, name):
    rec = _get(rows, name)  # the child compared the bits with numpy's
    assert not _float_collectives(rec), rec["collectives"]


def _dtype_names():
    # the child runs with jax_enable_x64: the 64-bit dtypes too
    others = ["float16", "float32", "int8", "int32", "uint16", "bool", "float8_e4m3fn",
              "float64", "int64"]
    return [f"reshard_dtype[{dt},{i}]" for dt in others for i in ("native", "lax", "auto")]


@pytest.mark.parametrize("name", _dtype_names())
def test_every_dtype_crosses_devices_as_unsigned_integers(rows, name):
    """A where whose operands and result are sharded differently and a row-sharded gather
    whose result is resharded keep random bits (the child compared them with numpy's),
    and every collective moves unsigned integers."""
    rec = _get(rows, name)
    kinds = {c[1] for c in rec["collectives"]}
    assert rec["collectives"] and kinds <= {"u8", "u16", "u32", "u64"}, rec["collectives"]


@pytest.mark.parametrize("name", _names("export"))
def test_sharded_export_round_trip(rows, name):
    """Exported, serialized, deserialized and called on the mesh: the child compared bits
    and result sharding with the direct jit's. The deserialized program keeps the table
    sharded (auto axes: the lax path, which XLA partitions with integer sums; explicit
    axes: a shard_map region) and its bf16 values move as integers."""
    rec = _get(rows, name)
    table, result, n = rec["table"], rec["result"], rec["ndev"]
    assert not any(c[2] >= table / 2 for c in rec["collectives"]), rec["collectives"]
    assert not [c for c in rec["collectives"] if c[1] in ("bf16", "f8e5m2")], rec
    assert not [c for c in rec["collectives"] if c[1] in FLOATS and c[0] != "all-gather"], rec
    assert rec["temp"] <= 2 * table / n + 4 * result + SLACK, rec
    if "[grad," in name:  # a bare gradient comes back sharded as its table
        assert rec["spec"][0] == "x", rec["spec"]
