"""Why `blockdraft serve` decodes on the main thread: a torch matmul on the main thread vs on a second thread.

    python benchmarks/omp_threads.py [--threads 2]

Every thread that calls torch gets an OpenMP team of its own. Once the main thread has one (it has as soon
as it has run any parallel op, e.g. loading a model), a second thread's team puts more OpenMP threads on
the machine than it has cores, and libgomp stops spin-waiting between parallel regions. Prints the median
time of a bf16 and a float32 8 x 576 x 1536 matmul on the main thread, then on a second thread; run it
also with OMP_WAIT_POLICY=PASSIVE to see the main thread fall to the second thread's time.
"""

import argparse
import statistics
import threading
import time

import torch


def bench(tag: str, reps: int = 2000) -> None:
    inputs = {"bf16": (torch.randn(8, 576, dtype=torch.bfloat16), torch.randn(1536, 576, dtype=torch.bfloat16)),
              "float32": (torch.randn(8, 576), torch.randn(1536, 576))}
    with torch.inference_mode():
        for name, (x, w) in inputs.items():
            for _ in range(200):
                torch.nn.functional.linear(x, w)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - t0)
            print(f"{tag:14s} {name:8s} {statistics.median(times) * 1e6:7.1f} us", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(p.parse_args().threads)
    bench("main thread")
    worker = threading.Thread(target=bench, args=("second thread",))
    worker.start()
    worker.join()
    bench("main again")


if __name__ == "__main__":
    main()
