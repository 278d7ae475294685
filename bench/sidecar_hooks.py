"""bench_scale's hooks in its sidecar child, run (``exec``) before ``rlm serve`` starts, in this checkout's sidecar
and in ``--baseline``'s alike (the file is read from this checkout):

- each Python thread gives the OS its name (``prctl(PR_SET_NAME)``, 15 bytes), so the per-thread split of the burst
  (``bench_scale.thread_cpu``) names the copy workers (``rlm-copy-<n>``), the metadata consumer (``rlmm-consumer-*``)
  and apscheduler's threads, not ``python`` each;
- apscheduler's pool threads run whichever job is due (discovery, stage, gauges, expiration, gc), so a thread's CPU
  does not say whose it is: each job run's thread CPU (``time.thread_time``) is summed by job id and written, as JSON,
  to the file named by ``RLM_BENCH_JOB_CPU`` once a second (bench_scale reads it before and after the burst).
"""

import ctypes
import json
import os
import threading
import time

_prctl = ctypes.CDLL(None).prctl
_bootstrap_inner = threading.Thread._bootstrap_inner


def _named(self: threading.Thread) -> None:
    _prctl(15, self.name.encode()[:15], 0, 0, 0)
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named

_JOB_CPU: dict[str, float] = {}
_OUT = os.environ.get("RLM_BENCH_JOB_CPU")
if _OUT:
    import apscheduler.executors.pool as _pool

    _run_job = _pool.run_job

    def _timed(job, *args):  # noqa: ANN001, ANN002, ANN202 - apscheduler's run_job
        t0 = time.thread_time()
        try:
            return _run_job(job, *args)
        finally:
            _JOB_CPU[job.id] = _JOB_CPU.get(job.id, 0.0) + time.thread_time() - t0

    _pool.run_job = _timed

    def _write() -> None:
        while True:
            time.sleep(1.0)
            tmp = _OUT + ".tmp"
            with open(tmp, "w") as f:
                json.dump(dict(_JOB_CPU), f)
            os.replace(tmp, _OUT)

    threading.Thread(target=_write, name="bench-job-cpu", daemon=True).start()
