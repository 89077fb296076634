"""A Ray cluster of this machine for a test, in a process of its own: prints its address,
and on SIGTERM shuts down everything it started (`tests/test_sweep.py`)."""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile

import ray


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # Ray's threads too
    temp = tempfile.mkdtemp(prefix="testbed-ray-head-")
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
                 _temp_dir=temp)
        print(ray.get_runtime_context().gcs_address, flush=True)
        signal.sigwait([signal.SIGTERM])
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
