"""Does a loader's first wave (every worker's first batch ready at once) give a training loop a
head start, or only a step slowed while the workers run (cudnn's search, a compile)? A real torch
DataLoader whose workers sleep for their "decode" (0.4 s a batch each: 4 workers supply 10
batches/s) feeds a loop whose step sleeps 0.08 s (12.5 batches/s asked: the loader gives 0.80 of
it). Prints, per case, the fraction of the step's demand the window after warm-up saw and the
data-wait share of the window's first half and last quarter (verify's drain rule); last, with
the batches ready at the warm-up's end taken without a step (verify's skip_ready).

    python scripts/first_wave.py            # 2-core dev VM: about 55 s
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

WORKERS, PER_BATCH_S, STEP_S, STEPS, WARMUP = 4, 0.4, 0.08, 150, 5


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(PER_BATCH_S / 8)
        return torch.zeros(1)


def run(slow_step_s: float, skip: bool = False) -> None:
    loader = DataLoader(Sleepy(), batch_size=8, num_workers=WORKERS, prefetch_factor=4,
                        persistent_workers=True)  # fmt: skip
    it = iter(loader)
    ready, waits = [], []
    for i in range(STEPS):
        if skip and i == WARMUP:  # verify's skip_ready: ready batches taken without a step
            while True:
                t0 = time.perf_counter()
                next(it)
                if time.perf_counter() - t0 > 0.005:
                    break
        t0 = time.perf_counter()
        next(it)
        t1 = time.perf_counter()
        ready.append(t1)
        waits.append(t1 - t0)
        time.sleep(slow_step_s if i == 2 else STEP_S)  # step 2: in the warm-up
    w = ready[WARMUP:]
    fraction = (len(w) - 1) / (w[-1] - w[0]) * STEP_S
    half, quarter = len(w) // 2, len(w) - len(w) // 4
    first = sum(waits[WARMUP + 1 : WARMUP + half]) / (w[half - 1] - w[0])
    last = sum(waits[WARMUP + quarter + 1 :]) / (w[-1] - w[quarter])
    how = ", ready batches skipped after it" if skip else ""
    print(f"slow warm-up step {slow_step_s:.2f} s{how}: window {fraction:.3f} of the demand "
          f"(the loader supplies 0.80); data wait, first half {first:.1%}, "
          f"last quarter {last:.1%}")  # fmt: skip
    del it, loader


if __name__ == "__main__":
    run(STEP_S)  # no slow step: the first wave alone
    run(3.0)  # a 3 s step in the warm-up: 16 batches (4 workers × prefetch 4) queue meanwhile
    run(3.0, skip=True)  # the same, the ready batches taken at the warm-up's end
