"""examples/torch_fashion_mnist.py end to end at 2 ranks on a slice of
Fashion-MNIST: DistributedOptimizer with hitopk, and the step API with
gns,adascale. Skipped (77) without torch or without the Debian data."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def main():
    harness.skip_without_torch()
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("skipped: no %s (dataset-fashion-mnist)" % DATA)
        return 77
    src = os.environ.get("TIDE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    example = os.path.join(src, "examples", "torch_fashion_mnist.py")
    common = ["--subset", "3072", "--test-subset", "1000", "--epochs", "1", "--json"]
    for extra, want in ((["--compression", "hitopk:0.05", "--model", "mlp"], "final: mlp tide, 2 ranks"),
                        (["--adapt", "gns,adascale", "--model", "mlp"], "final: mlp tide, 2 ranks")):
        cmd = [harness.tiderun(), "-np", "2", "--timeout", "240", sys.executable, example] + common + extra
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(p.stdout, end="")
        if p.returncode != 0 or want not in p.stdout or '"final_accuracy"' not in p.stdout:
            print("FAIL: %s" % " ".join(cmd))
            return 1
    print("test_example: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
