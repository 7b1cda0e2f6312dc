"""cProfile of one single-machine preprocessing run (in-process; workers > 1 profiles only the
main process): where pass 1 (parse, count, spill) and pass 2 (encode) spend CPU.

    python benchmarks/profile_preprocess.py INPUT.tsv [--workers 1] [--test-rows 200000] [--sort tottime]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time

from dlrmkit.data.criteo import CriteoOptions, preprocess


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("input")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--test-rows", type=int, default=200_000)
    p.add_argument("--sort", default="tottime")
    p.add_argument("--rows", type=int, default=30, help="functions to list")
    a = p.parse_args()
    out = tempfile.mkdtemp(prefix="dlrmkit-ppprof-") + "/ds"
    opts = CriteoOptions(inputs=[a.input], out=out, test_rows=a.test_rows, workers=a.workers, progress=False)
    prof = cProfile.Profile(time.process_time)
    c0, w0 = time.process_time(), time.perf_counter()
    prof.enable()
    preprocess(opts)
    prof.disable()
    print(f"CPU {time.process_time() - c0:.2f} s (this process), wall {time.perf_counter() - w0:.2f} s")
    pstats.Stats(prof).sort_stats(a.sort).print_stats(a.rows)
    shutil.rmtree(out.rsplit("/", 1)[0], ignore_errors=True)


if __name__ == "__main__":
    main()
