"""Failover benchmark: takeovers under steady load, against the supervisor-restart baseline.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.failover --rounds 20 --rate 1000
    .venv/bin/python -m bench.failover --kinds kill --rounds 5 --hosts 10000   # a real key space

Works on the running local stack's own two engines, under its supervisord (autorestart),
with steady synthetic load on its inbound topic. Three failures of the active, `--rounds`
each, every round waiting first for an in-sync standby:
  kill     SIGKILL; supervisord restarts the engine, which resumes from its checkpoint
           and rejoins as the standby;
  sigstop  the active freezes (a zombie) until 5 s after its successor has published,
           then resumes and must find itself fenced and step down;
  expire   the active freezes for 2.5 granted ZooKeeper session timeouts: its session
           expires, and it resumes while the successor is taking over.
Takeover time = from the failure to the first record of the new election epoch visible to
a read_committed consumer of the outbound topic; also the time until the successor reports
itself active, and until the pair is whole again: the victim back, normally as the in-sync
standby (a role swap after the takeover, the successor's session lost meanwhile, is
counted). A round that fails, or Ctrl-C, ends the run; the rounds before it are kept,
audited and written.

Baseline (`--baseline-rounds`): the usual alternative, one engine and no standby, restarted
by supervisord after kill -9 (a single Spark query under a supervisor): its takeover is
from the kill to its first output after the restart.

At the end every inbound offset of the run is checked to be in the outbound or dead-letter
topic exactly once. Prints the figures, writes docs/bench/failover.json and
docs/bench/failover.png (output rate over time, failures marked).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.plots import plot, rate_series, write_figures
from devkit.chaos import (
    KINDS,
    Round,
    SteadyLoad,
    SupervisedEngines,
    audit_load,
    failover_round,
    flagged,
)
from devkit.harness import OutputSampler, example_pipeline, inbound_ends, machine, summary, wait_for
from twinstream.ops.drill import KafkaEpochTail, Takeover, measure_takeover
from twinstream.platform.settings import REPO_ROOT


def baseline_round(engines: SupervisedEngines) -> float:
    """kill -9 the only engine; seconds until supervisord's restart publishes again."""
    (active,) = [e for e in engines.clients if engines.pid(e)]
    client = engines.clients[active]
    wait_for(lambda: client.server().role == "active", 300, f"engine {active} active")
    result = Takeover(active, client.server().epoch, None)
    pid = engines.pid(active)
    with KafkaEpochTail(engines.settings) as tail:
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        measure_takeover(result, engines.clients, tail, started, timeout_s=600)
    if result.first_output_s is None:
        raise SystemExit(f"baseline: no output within 600 s of the kill: {result.describe()}")
    print(f"  baseline: {result.describe()}", flush=True)
    return result.first_output_s


def warm_up(
    engines: SupervisedEngines,
    load_started: float,
    settle_s: float = 60.0,
    timeout_s: float = 900.0,
) -> None:
    """Freshly started engines run their first batches several times slower (JIT, Python
    workers, RocksDB) and fall behind the load at first: wait, with a progress line, until
    one is active and the other an in-sync standby, and not before `settle_s` of load. Idle
    engines are "in sync" before the load has reached them: without the settle time the
    first round of a run on a just-started stack struck while the standby was still far
    behind (a 29 s takeover in a run whose other rounds took 1-3 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        settled = time.monotonic() - load_started >= settle_s
        if settled:
            try:
                engines.wait_pair(timeout_s=15)
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        lags: dict[str, int | str | None] = {}
        for engine_id, client in engines.clients.items():
            try:
                lags[engine_id] = client.pipeline().lag
            except Exception as exc:  # reported in the progress line, waited out
                lags[engine_id] = f"unreachable ({exc})"
        print(
            f"  warming up ({time.monotonic() - load_started:.0f} s of load): lags {lags}",
            flush=True,
        )
        if not settled:
            time.sleep(min(15.0, max(0.0, load_started + settle_s - time.monotonic())))


def run_rounds(
    engines: SupervisedEngines,
    args: argparse.Namespace,
    rounds: dict[str, list[Round]],
    marks: list[tuple[float, str]],
    t0: float,
) -> str | None:
    """`args.rounds` failures of each kind into `rounds`; why the run stopped early, if it
    did. The rounds done so far are measurements: a failed round or Ctrl-C ends the run
    but keeps them, to be audited and written, rather than lose them all."""
    try:
        for kind in args.kinds:
            for n in range(1, args.rounds + 1):
                marks.append((time.monotonic() - t0, kind))
                r = failover_round(engines, kind, rejoin_timeout_s=args.rejoin_timeout)
                if r.takeover.first_output_s is None:
                    raise AssertionError(f"{kind}: no output after the takeover: {r.takeover}")
                rounds[kind].append(r)
                swapped = "; roles swapped after it" if r.swapped else ""
                print(f"{kind} {n}/{args.rounds}: {r.takeover.describe()}{swapped}", flush=True)
    except (AssertionError, KeyboardInterrupt) as exc:
        stopped = str(exc) or "interrupted"
        print(f"run stopped early: {stopped}", flush=True)
        return stopped
    return None


def per_kind(
    rounds: dict[str, list[Round]], value: Callable[[Round], float | None]
) -> dict[str, Any]:
    """summary() of one figure per kind; rounds where it is None (none, see run_rounds and
    failover_round) are left out."""
    figures = {k: [x for r in v if (x := value(r)) is not None] for k, v in rounds.items()}
    return {k: summary(v) for k, v in figures.items() if v}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="failures of each kind")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--baseline-rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=1000.0, help="inbound events per second")
    parser.add_argument(
        "--hosts",
        type=int,
        default=10,
        help="distinct hosts (keys) in the load: 10,000 and more as a real key space",
    )
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds of load before the first round"
    )
    parser.add_argument(
        "--rejoin-timeout",
        type=float,
        default=900.0,
        help="seconds for a killed engine to be back in the pair (restart + catch-up)",
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    # The stack's own pipeline as it runs (three partitions in pipelines.toml).
    settings = example_pipeline()
    engines = SupervisedEngines(settings)
    if not engines.supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    firsts = inbound_ends(settings)
    t0 = time.monotonic()
    sampler = OutputSampler(settings, [settings.outbound_topic, settings.dlq_topic])
    # Before waiting for the pair: a standby counts as in sync only once it has
    # processed input.
    load = SteadyLoad(settings, args.rate, args.hosts).start()
    try:
        warm_up(engines, time.monotonic(), args.settle)
    except BaseException:
        load.stop()
        raise
    marks: list[tuple[float, str]] = []
    rounds: dict[str, list[Round]] = {k: [] for k in args.kinds}
    baseline: list[float] = []
    try:
        stopped_early = run_rounds(engines, args, rounds, marks, t0)
        if args.baseline_rounds and stopped_early is None:
            standby = engines.wait_pair()[1]
            engines.supervisor.stop(f"engine-{standby}")
            try:
                for n in range(1, args.baseline_rounds + 1):
                    marks.append((time.monotonic() - t0, "baseline kill"))
                    baseline.append(baseline_round(engines))
                    print(f"baseline {n}/{args.baseline_rounds}: {baseline[-1]:.1f} s")
            finally:
                engines.supervisor.start(f"engine-{standby}")
            engines.wait_pair(timeout_s=600)
    finally:
        sent = load.stop()
    print(f"waiting for all {sent:,} events of the run to be published", flush=True)
    audited = audit_load(engines, firsts, sent)
    sampler.stop()
    engines.close()
    ok = all(f.ok for f in audited.values())

    figures: dict[str, Any] = {
        "rate_per_s": args.rate,
        "hosts": args.hosts,
        "messages": sent,
        "takeover_to_first_output_s": per_kind(rounds, lambda r: r.takeover.first_output_s),
        "takeover_to_active_s": per_kind(rounds, lambda r: r.takeover.role_s),
        # From the failure until an active and an in-sync standby again, the victim one of them.
        "back_as_in_sync_standby_s": per_kind(rounds, lambda r: r.rejoin_s),
        "role_swaps_after_takeover": {k: sum(r.swapped for r in v) for k, v in rounds.items()},
        "stopped_early": stopped_early,
        "baseline_supervisor_restart_s": summary(baseline) if baseline else None,
        "gaps": flagged(audited, "missing"),
        "duplicates": flagged(audited, "duplicated"),
        "machine": machine(),
    }
    write_figures(args.output, "failover", figures)
    path = plot(
        args.output / "failover.png",
        f"Output rate under {args.rate:,.0f} events/s with failures of the active",
        {"output events/s, 3 s average": rate_series(sampler.samples, t0, window_s=3.0)},
        "output events/s",
        marks=marks,
        xlabel="seconds",
    )
    print(f"wrote {path}")
    return 0 if ok and stopped_early is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
