"""Shared by the tide.torch tests: each test file is its own driver (run by
ctest with /usr/bin/python3) that launches itself under tiderun as workers.
Exit 77 (skipped) when torch cannot be imported."""
import os
import subprocess
import sys


def skip_without_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("skipped: %s" % e)
        sys.exit(77)


def tiderun():
    tools = os.environ.get("TIDE_TOOLS_DIR")
    return os.path.join(tools, "tiderun") if tools else "tiderun"


def launch(script, np, *args, timeout=240, env=None, check=True):
    """Runs `tiderun -np NP -l python3 script --worker args`; returns
    (exit code, output). check: fail unless the exit code is 0."""
    cmd = [tiderun(), "-np", str(np), "-l", "--timeout", str(timeout), sys.executable, script, "--worker"]
    cmd += [str(a) for a in args]
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
    print(p.stdout, end="")
    if check and p.returncode != 0:
        print("FAIL: %s exited %d" % (" ".join(cmd), p.returncode))
        sys.exit(1)
    return p.returncode, p.stdout


def lines(out, word):
    return [l for l in out.splitlines() if word in l]


def expect_lines(out, word, n):
    """True when n lines of out contain word; else prints a FAIL line."""
    if len(lines(out, word)) == n:
        return True
    print("FAIL: expected %d ranks to print '%s'" % (n, word))
    return False


def ranks_pass(script, np, name):
    """main() of a test whose worker("all") prints "rank R passed": runs it on
    np ranks (errors only in the log) and returns the exit status."""
    skip_without_torch()
    _, out = launch(os.path.abspath(script), np, "all", env={"TIDE_LOG_LEVEL": "error"})
    if not expect_lines(out, "passed", np):
        return 1
    print("%s: passed" % name)
    return 0


def dispatch(main, worker):
    """A test file's entry: `--worker ARG` runs worker(ARG) (a rank under
    tiderun), anything else exits with main()'s status."""
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    else:
        sys.exit(main())
