"""Issue 6's three Flink queries, run on this machine for a like-for-like comparison with Vigil.

Apache Flink 2.3 (PyPI `apache-flink`) in its local mini-cluster, parallelism 1, over the same
JSON lines `vigil bench` reads (`ts` epoch milliseconds, +1 ms per event, 1,000 machines).
Results go to a blackhole sink, so the time is reading, decoding and evaluating.

    python3 benches/flink/flink_queries.py q1|q2|q3 EVENTS.jsonl

prints one JSON object: the query, the file, and the job's wall time from submission to its
end. The whole process, start-up included, is timed from outside (`benches/flink/measure.py`);
the steady-state rate comes from two files of different sizes (BENCHMARKS.md, "Against
Apache Flink 2.3 on this machine"), so that start-up and the JIT's warm-up cancel out.
"""

import json
import sys
import time

from pyflink.table import EnvironmentSettings, TableEnvironment

SOURCE = """
CREATE TABLE events (
  `stream` STRING,
  ts BIGINT,
  job_id STRING,
  task_index INT,
  machine_id STRING,
  cpu DOUBLE,
  mem DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')
"""

SINKS = {
    "q1": "CREATE TABLE sink (ts BIGINT, machine_id STRING, cpu DOUBLE) WITH ('connector' = 'blackhole')",
    "q2": "CREATE TABLE sink (machine_id STRING, window_start TIMESTAMP(3), avg_cpu DOUBLE, max_mem DOUBLE,"
    " n BIGINT) WITH ('connector' = 'blackhole')",
    "q3": "CREATE TABLE sink (machine_id STRING, a_ts BIGINT, b_ts BIGINT) WITH ('connector' = 'blackhole')",
}

QUERIES = {
    # Q1: one filter.
    "q1": "INSERT INTO sink SELECT ts, machine_id, cpu FROM events WHERE cpu > 0.95",
    # Q2: a 10 s tumbling window per machine, alerting when avg(cpu) > 0.9.
    "q2": """
INSERT INTO sink
SELECT machine_id, window_start, AVG(cpu), MAX(mem), COUNT(*)
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rt), INTERVAL '10' SECOND))
GROUP BY machine_id, window_start, window_end
HAVING AVG(cpu) > 0.9
""",
    # Q3: per machine, cpu > 0.9 followed within 30 s by mem > 0.9, skipping past the match.
    "q3": """
INSERT INTO sink
SELECT machine_id, a_ts, b_ts
FROM events MATCH_RECOGNIZE (
  PARTITION BY machine_id
  ORDER BY rt
  MEASURES A.ts AS a_ts, B.ts AS b_ts
  ONE ROW PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A C*? B) WITHIN INTERVAL '30' SECOND
  DEFINE A AS A.cpu > 0.9, B AS B.mem > 0.9
)
""",
}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in QUERIES:
        sys.exit("usage: flink_queries.py q1|q2|q3 EVENTS.jsonl")
    query, path = sys.argv[1], sys.argv[2]
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", "1")
    env.execute_sql(SOURCE.format(path=path))
    env.execute_sql(SINKS[query])
    started = time.monotonic()
    env.execute_sql(QUERIES[query]).wait()
    print(json.dumps({"query": query, "file": path, "job_seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main()
