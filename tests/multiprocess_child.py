"""One process of test_multiprocess.py: joins a 2-process jax.distributed job on loopback
(gloo CPU collectives, 2 host devices per process), then runs the sharding matrix of
sharding_checks.py over the 4 global devices and writes OUTDIR/process<ID>.json.

    python tests/multiprocess_child.py PORT PROCESS_ID OUTDIR
"""
import json
import os
import sys

import jax

if __name__ == "__main__":
    port, pid, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid, initialization_timeout=120)
    # Only now: the checks build their meshes from the global devices at import.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sharding_checks as sc

    assert jax.process_count() == 2 and len(sc.DEV) == 4 and jax.local_device_count() == 2, (
        jax.process_count(), len(sc.DEV), jax.local_device_count())
    sc.run_matrix()
    with open(os.path.join(outdir, f"process{pid}.json"), "w") as f:
        json.dump(sc.RESULTS, f, indent=1)
    jax.distributed.shutdown()
