"""jax.export: serialize a function that uses jax_ext, then deserialize and call it in a
fresh process (which must import jax_ext first, to register the native targets).
Needs the flatbuffers package (in the test extra)."""
import subprocess
import sys
import tempfile

import jax
import numpy as np
from jax.typing import ArrayLike

import jax_ext


def f(c: ArrayLike, x: ArrayLike, y: ArrayLike, table: ArrayLike,
      idx: ArrayLike) -> tuple[jax.Array, jax.Array]:
    return jax_ext.where(c, x, y), jax_ext.gather(table, [0], 0, idx)


rng = np.random.default_rng(0)
args = (rng.random(8) < 0.5, rng.standard_normal(8).astype(np.float32),
        np.float32(-1.0), rng.standard_normal((10, 8)).astype(np.float32),
        np.array([3, 0, 11], np.int32))
exp = jax.export.export(jax.jit(f), disabled_checks=jax_ext.export_checks())(*args)
blob = exp.serialize()
want = [np.asarray(a) for a in f(*args)]

with tempfile.TemporaryDirectory() as d:
    np.savez(f"{d}/args.npz", *args)
    with open(f"{d}/f.bin", "wb") as fh:
        fh.write(blob)
    child = f"""
import jax, numpy as np
import jax_ext  # registers the native targets: import it before calling the export
a = np.load("{d}/args.npz")
exp = jax.export.deserialize(open("{d}/f.bin", "rb").read())
out = exp.call(*(a[f"arr_{{i}}"] for i in range(len(a.files))))
np.savez("{d}/out.npz", *[np.asarray(o) for o in out])
"""
    subprocess.run([sys.executable, "-c", child], check=True, cwd=d)
    got = np.load(f"{d}/out.npz")
    for i, w in enumerate(want):
        assert got[f"arr_{i}"].tobytes() == w.tobytes(), i
print("exported", len(blob), "bytes; the fresh process reproduced both results")
