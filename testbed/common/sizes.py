"""Limits on the counts that set how large a plan and a run are. A value past one (a typo,
an extra zero) is one line naming the key, the value and the limit, not minutes of
planning and gigabytes of memory before anything is said.

Each leaves the largest published training setups, and the shipped paper-scale topology
(gpt3-4dc: GPT-3 175B on 1,024 H100s, 32 microbatches per replica), well inside; measured
on this 2-core machine (`/usr/bin/time testbed plan|simulate ...`):

- microbatches per replica per iteration, given or derived from `global_batch`: the plan
  holds every microbatch's actions on every GPU. Megatron-style schedules use a few times
  the pipeline depth (gpt3-4dc: 32 for 16 stages); 1,024 covers 64 stages at 16 per stage.
  Planning two-dc takes about 1 s at 1,024, 10 s and 300 MB at 65,536, and 2,000,000 ran
  for minutes at 3.7 GB.
- GPUs in one topology: the plan has a worker per GPU (over tp). 16,384 is the largest
  published training run's size (Llama 3 405B); 65,536 leaves room for studies past it.
  gpt3-4dc grown to 32,768 GPUs (8 microbatches) plans, simulates and writes its results
  in under a minute at 245 MB (spans are kept per tensor-parallel group,
  testbed.common.span_table); at 400,000 planning alone took 2 minutes and 2.4 GB.
- iterations: the simulator keeps every iteration's spans (paper-3dc: 200 iterations took
  9 s and 370 MB, about 1.8 MB each), and a figure is a median over tens of iterations.
  10,000 is a day of emulated paper-3dc and about as much as this machine's memory holds
  simulated.
- a run's length in seconds, on the simulator's clock and in the span times read back: at
  1e10 s (317 years) float64 seconds still resolve 2 us, finer than the shortest round
  trip the flow model has (10 us, testbed.sim.flows.MIN_RTT_S), so every round of TCP still
  moves the clock; far past it a round trip adds nothing and a run never ends. 10,000
  iterations of an hour each are 3.6e7 s.
- repeats of each combination (`compare`, `sweep --repeat`): a spread's median and
  percentiles settle within tens; a thousand simulated repeats of two-dc are minutes, and
  every run is a directory of its own. `--repeat 1000000000` held 1.7 GB after a minute
  making runs before one ran.
- a sweep's runs (points x policies x bubble policies x repeats): checking each run as it
  is made took 6 ms (10,000 points of two-dc in a minute, 63 MB), and a simulated run of
  the smallest topology a fraction of a second; 100,000 is hours of simulation already.
- inference requests a run makes (`inference.arrival_rate` over its length): each one is
  kept to the end (paper-3dc's bubbles at 1,000/s: 324,326 requests, 356 MB); 1,000,000
  of them is about a gigabyte. The rate is at most 100,000/s (250 times the benchmarks'
  400/s): at that rate 10 s of a run makes the million; 1e12/s ran out of memory.
- seeds: 0 to 2^32 - 1, what every consumer takes (numpy's legacy seeding, torch's
  generators seeded with seed x 1,000,003 + a sample's index within their 64 bits, netem's
  seed x 1000 + a port, JSON's integers); 2^64 ran and then failed to save its results.
"""

from __future__ import annotations

MAX_MICROBATCHES = 1024
MAX_GPUS = 65_536
MAX_ITERATIONS = 10_000
MAX_RUN_S = 1e10
MAX_REPEATS = 1000
MAX_SWEEP_RUNS = 100_000
MAX_REQUESTS = 1_000_000
MAX_ARRIVAL_RATE = 100_000.0
MAX_SEED = 2**32 - 1
MAX_GLOBAL_BATCH = MAX_MICROBATCHES * MAX_GPUS
"""Sequences per iteration: as many microbatches as allowed on every GPU a topology may
have (a bound checked as the job is read; the microbatches it makes per replica are
checked when a plan is built, once dp is known)."""
