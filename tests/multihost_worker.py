"""One process of the multi-host test (tests/test_multihost.py); also a runnable example.

    python tests/multihost_worker.py --num-processes 2 --process-id 0 --port 12355 --out /tmp/mh &
    python tests/multihost_worker.py --num-processes 2 --process-id 1 --port 12355 --out /tmp/mh

Each process: 4 CPU devices (8 with --num-processes 1), ``jax.distributed.initialize`` on a
loopback coordinator, gloo CPU collectives, then two auto-sharded steps of the small GPT on a
(2, 4) mesh over both processes' devices. Process 0 writes the losses and the gathered new
parameters; every process writes its plan fingerprint and layout to ``OUT/result_<id>_of_<n>.json``.
``--mismatch`` then calls steps whose arguments differ between the processes and records the
`MultiHostMismatch` each process raises.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-processes", type=int, default=2)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--devices", type=int, default=0, help="CPU devices per process")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mismatch", action="store_true", help="also run the mismatch scenarios")
    ap.add_argument("--watchdog", type=float, default=0, help="dump stacks and exit after S s")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)  # a fresh machine has no output folder yet
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    nproc, me = args.num_processes, args.process_id
    per_process = args.devices or 8 // nproc

    devices = f"--xla_force_host_platform_device_count={per_process}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {devices}".strip()
    sys.path.insert(0, ROOT)  # `models`, `jaxpar` from this checkout
    import jax

    jax.config.update("jax_num_cpu_devices", per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if nproc > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=nproc,
            process_id=me,
            initialization_timeout=60,
        )

    import jaxpar_zoo as zoo
    import numpy as np
    from jax.experimental import multihost_utils

    import jaxpar
    from jaxpar.runtime import distributed

    result: dict = {"process": me, "process_count": jax.process_count()}
    t0 = time.monotonic()
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    result["mesh_processes"] = [[d.process_index for d in row] for row in mesh.devices]
    ex = zoo.get("gpt_small", small=True)
    state, batch0 = ex.make_args(0)
    _, batch1 = ex.make_args(1)

    def local_rows(batch, process, count):
        rows = batch["tokens"].shape[0] // count
        return {"tokens": np.asarray(batch["tokens"])[process * rows : (process + 1) * rows]}

    def as_global(batch):
        return distributed.global_batch(local_rows(batch, me, nproc), mesh)

    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100")
    # state: jax arrays on this process's first device, the same values on every process (same
    # seed); auto_shard puts them onto the plan's global shardings unchanged.
    losses = []
    for batch in (batch0, batch1):
        state, metrics = step(state, as_global(batch))
        loss = multihost_utils.process_allgather(metrics["loss"], tiled=True)
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    fp = distributed.fingerprint(step.plan, (state, as_global(batch0)))
    result.update(
        losses=losses,
        digest=fp.digest,
        parts=fp.parts,
        run_s=time.monotonic() - t0,
    )
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if me == 0:
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        np.savez(
            os.path.join(args.out, f"params_{nproc}.npz"),
            **{jax.tree_util.keystr(p): np.asarray(v) for p, v in flat},
        )

    if args.mismatch and nproc > 1:
        result["mismatch"] = {}

        def expect_mismatch(name, fn):
            print(f"process {me}: scenario {name}", file=sys.stderr, flush=True)
            t = time.monotonic()
            try:
                fn()
            except distributed.MultiHostMismatch as err:
                result["mismatch"][name] = {
                    "part": err.part,
                    "processes": {str(k): list(v) for k, v in err.processes.items()},
                    "message": str(err),
                    "seconds": time.monotonic() - t,
                }
            else:
                result["mismatch"][name] = {"part": None, "seconds": time.monotonic() - t}

        # a static value that differs: same shapes, same plan, different signature
        tagged = jaxpar.auto_shard(lambda s, b, tag: ex.step(s, b), mesh=mesh, cluster="p100")
        expect_mismatch("static", lambda: tagged(state, as_global(batch0), f"run-{me}"))

        # a batch shape that differs: process 1 loads half as many rows. A fresh step, so that
        # both processes plan (a process whose signature is cached runs without a check)
        fresh = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100")

        def shape():
            local = local_rows(batch0, me, nproc)
            if me == 1:
                local = {"tokens": local["tokens"][: local["tokens"].shape[0] // 2]}
            fresh(state, distributed.global_batch(local, mesh))

        expect_mismatch("shape", shape)
        # after both: the same call again agrees and runs (the check counters stayed in step)
        state, metrics = step(state, as_global(batch0))
        result["after_mismatch_loss"] = float(
            np.asarray(multihost_utils.process_allgather(metrics["loss"], tiled=True)).reshape(-1)[
                0
            ]
        )
        # a process that never plans: process 1 skips the step, process 0 times out (last: the
        # check counters disagree afterwards)
        if me == 0:
            lone = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100", strategy="data")
            expect_mismatch("arrival", lambda: lone(state, as_global(batch0)))

    with open(os.path.join(args.out, f"result_{me}_of_{nproc}.json"), "w") as f:
        json.dump(result, f, indent=1)
    if nproc > 1:
        multihost_utils.sync_global_devices("jaxpar multihost worker done")
    print(f"process {me}: done in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
