"""What validating a record costs in the JVM, part by part: why it still parses twice.

    .venv/bin/python -m bench.parse --records 200000 --rounds 3

Issue 35 point 1 asked for one JSON parse per record: `twinstream.engine.pipeline.validated`
parses each record as a variant (`try_parse_json`: strict JSON and the members' JSON types,
for the checks) and again with the schema (`from_json`: the typed values, as Jackson reads
them). Reading the typed values from the variant instead (`try_variant_get` per member, or
one cast of the whole variant to the schema's struct) would drop the second parse: this
measures whether it would be cheaper. In one local Spark session (`local[1]`: one core, as
one engine's task), over the same records of a pipeline's own sample read from a Parquet
file, each query written to Spark's `noop` sink, round after round:

- scan: the records as strings, nothing parsed;
- variant: `try_parse_json` alone;
- from_json: the schema's parse alone;
- variant + members: `try_variant_get` of every member, typed;
- variant + struct: one `try_variant_get` of the whole variant as the schema's struct;
- validated: the engines' whole validation;
- validated at REV (`--against REV`): `validated` as the commit REV had it (its
  `twinstream/engine/pipeline.py`, or `twinstream/pipeline.py` before the layout by wing,
  imported beside this tree's modules), for a before and after in
  one run: `--against 9fe82b1` is before the validation's checks were cut (issue 35).

Prints each part's µs a record (the median of the rounds) and the two ways of typing side by
side. Writes `docs/bench/parse.json` and `docs/bench/parse.png`.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bench.plots import plot, write_figures
from devkit.harness import machine
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, load_settings
from twinstream.testing import reference

NOW = "include/twinstream/engine/pipeline.py"
BEFORE_WINGS = "include/twinstream/pipeline.py"
# The modules the plan imported before the layout by wing, and what they are now.
OLD_IMPORTS = {
    "from twinstream.config import": "from twinstream.platform.settings import",
    "from twinstream.kafka import spark_kafka_security": (
        "from twinstream.platform.kafka import connection\n\n\n"
        "def spark_kafka_security(settings: Settings) -> dict[str, str]:\n"
        "    return connection(settings).spark_options()\n"
    ),
    "from twinstream.state.processor import": "from twinstream.engine.state.processor import",
}


def _validated_at(rev: str, folder: Path) -> Callable[..., Any]:
    """`twinstream.engine.pipeline.validated` as commit `rev` had it (before issue 36's
    layout: `twinstream.pipeline`, its imports renamed to where those modules are now)."""
    source = None
    for where, renames in ((NOW, {}), (BEFORE_WINGS, OLD_IMPORTS)):
        shown = subprocess.run(
            ["git", "show", f"{rev}:{where}"], cwd=REPO_ROOT, capture_output=True, text=True
        )
        if shown.returncode == 0:
            source = shown.stdout
            for old, new in renames.items():
                source = source.replace(old, new)
            break
    if source is None:
        raise SystemExit(
            f"--against {rev}: no {NOW} or {BEFORE_WINGS} there ({shown.stderr.strip()}); "
            "name a commit of this repository"
        )
    path = folder / "pipeline_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("pipeline_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {rev}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Callable[..., Any], module.validated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--pipeline", default="hostmetrics")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    parser.add_argument("--against", metavar="REV", help="also time validated as of this commit")
    args = parser.parse_args(argv)
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be at least 1")

    from pyspark.sql import functions as F

    from twinstream.engine.pipeline import validated

    settings = load_settings(pipeline=args.pipeline)
    pipeline = registry.load(settings)
    if pipeline.sample is None:
        parser.error(f"pipeline {args.pipeline} has no sample to parse: choose one that has")
    spark = reference.session(settings, pipeline)
    schema = pipeline.struct()
    with tempfile.TemporaryDirectory(prefix="twinstream-parse-") as tmp:
        print(f"{args.records:,} records of {args.pipeline}'s sample to Parquet", flush=True)
        records = list(enumerate(pipeline.sample(args.records, 7, 0)))
        path = str(Path(tmp) / "records.parquet")
        spark.createDataFrame(records, "offset BIGINT, value BINARY").write.parquet(path)
        frame = spark.read.parquet(path)
        text = F.col("value").cast("string")
        doc = frame.select(F.expr("try_parse_json(cast(value as string))").alias("d"))
        parts: dict[str, Any] = {
            "scan": frame.select(text.alias("t")),
            "variant": doc,
            "from_json": frame.select(F.from_json(text, schema).alias("j")),
            "variant + members": doc.select(
                *(
                    F.expr(f"try_variant_get(d, '$.{f.name}', '{f.dataType.simpleString()}')")
                    for f in schema.fields
                )
            ),
            "variant + struct": doc.select(
                F.expr(f"try_variant_get(d, '$', '{schema.simpleString()}')")
            ),
            "validated": validated(frame, pipeline, settings),
        }
        if args.against:
            earlier = _validated_at(args.against, Path(tmp))
            parts[f"validated at {args.against}"] = earlier(frame, pipeline, settings)

        def timed(query: Any) -> float:
            started = time.perf_counter()
            query.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        for query in parts.values():  # unmeasured: the JIT's first pass over each plan
            timed(query)
        rounds: dict[str, list[float]] = {name: [] for name in parts}
        for n in range(1, args.rounds + 1):
            for name, query in parts.items():
                rounds[name].append(timed(query))
            line = ", ".join(f"{name} {times[-1]:.2f} s" for name, times in rounds.items())
            print(f"round {n}/{args.rounds}: {line}", flush=True)
    spark.stop()

    us = {name: statistics.median(t) / args.records * 1e6 for name, t in rounds.items()}
    figures = {
        "machine": machine(),
        "pipeline": args.pipeline,
        "schema": schema.simpleString(),
        "records": args.records,
        "seconds_per_round": rounds,
        "us_per_record": us,
        # The typed values: from the second parse, or from the variant the checks parse.
        "typing_by_from_json_us": us["from_json"] - us["scan"],
        "typing_from_the_variant_us": us["variant + members"] - us["variant"],
    }
    if args.against:
        before = us[f"validated at {args.against}"]
        figures["validated_before_over_now"] = before / us["validated"]
    write_figures(args.output, "parse", figures, echo=False)
    xs = [float(n) for n in range(1, args.rounds + 1)]
    plot(
        args.output / "parse.png",
        f"validating {args.records:,} {args.pipeline} records on one core, by part",
        {name: (xs, [t / args.records * 1e6 for t in times]) for name, times in rounds.items()},
        "µs a record",
        xlabel="round",
        marker="o",
    )
    for name, value in us.items():
        print(f"{name:24s} {value:6.2f} µs a record")
    print(
        f"typing the members: by from_json {figures['typing_by_from_json_us']:.2f} µs a record, "
        f"from the variant {figures['typing_from_the_variant_us']:.2f} µs; "
        f"{args.output / 'parse.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
