"""Child Python processes that import what this process imports.

A memory figure, a cold start or an OOM kill is only a run's own in a fresh process, so the
demo, the benchmarks and the tests run such work in children:

* ``run_python``: ``python -c CODE ARGS...``, output captured (tests, cgroup runs);
* ``run_child``: the demo's and the benchmarks' protocol: the parent re-runs a module,
  ``python -m MODULE --mode MODE --result FILE`` plus the model and run flags
  (ktmoe_harness.options), once per mode, and reads each child's JSON result.

Every child gets this process's ``sys.path`` as ``PYTHONPATH``, so it imports the same
torch_ktmoe (the in-tree build, not an installed one) and this harness.
"""
import json
import os
import subprocess
import sys


def python_env(extra=None) -> dict:
    """This environment with PYTHONPATH = this sys.path and OMP_WAIT_POLICY=PASSIVE unless it sets one (torch's
    OpenMP threads then sleep while they wait: docs/threads.md), plus the variables in `extra`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(extra or {})}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_python(code, args=(), timeout=300, env=None) -> subprocess.CompletedProcess:
    """Runs `code` in a new interpreter (sys.argv[1:] = args as strings), stdout/stderr captured as text.

    `env` adds to python_env().
    """
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=python_env(env))


def child_command(module, mode, result, checkpoint, work, args) -> list:
    """``python -m module`` for one mode, with the run flags of `args` (options.add_run_arguments)."""
    cmd = [sys.executable, "-m", module, "--mode", mode, "--result", result, "--checkpoint", checkpoint,
           "--format", args.format, "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens),
           "--mmap-dir", work]
    return cmd + (["--threads", str(args.threads)] if args.threads else [])


def run_child(module, mode, checkpoint, work, args, extra=(), quiet=False):
    """Runs one mode of `module` in its own process; its JSON result (work/MODE.json), or None if it failed.

    `extra`: more flags for the child; `quiet`: drop the child's stderr (progress bars).
    """
    result = os.path.join(work, f"{mode}.json")
    cmd = child_command(module, mode, result, checkpoint, work, args) + [str(a) for a in extra]
    if subprocess.run(cmd, env=python_env(), stderr=subprocess.DEVNULL if quiet else None).returncode != 0:
        return None
    with open(result) as f:
        return json.load(f)
