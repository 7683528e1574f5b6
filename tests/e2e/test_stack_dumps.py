"""SIGUSR1 makes a long-running command print every thread's stack and keep running."""

import subprocess
import sys

PROGRAM = """
import os, signal, threading
from helios.cli.stack_dumps import dump_stacks_on_sigusr1
assert dump_stacks_on_sigusr1()
def waiting_worker():
    threading.Event().wait(0.5)
worker = threading.Thread(target=waiting_worker, name="worker")
worker.start()
os.kill(os.getpid(), signal.SIGUSR1)
worker.join()
print("still running")
"""


def test_sigusr1_dumps_every_thread_and_the_process_continues():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"
    assert "waiting_worker" in done.stderr and "Current thread" in done.stderr
