#!/usr/bin/env python3
"""Writes nab.om.gz: three real NAB series (AWS CloudWatch, two weeks at five minutes each) in
OpenMetrics text, for `promtool tsdb create-blocks-from openmetrics` to fill a Prometheus with
known history (tests/backtest.rs).

    python3 tests/data/prometheus/make.py ../shared/data/nab tests/data/prometheus/nab.om.gz
"""
import csv
import datetime
import gzip
import sys

SERIES = [
    ("ec2_cpu_utilization", "realAWSCloudwatch/ec2_cpu_utilization_825cc2.csv", "ec2-825cc2:9100"),
    ("ec2_cpu_utilization", "realAWSCloudwatch/ec2_cpu_utilization_ac20cd.csv", "ec2-ac20cd:9100"),
    ("ec2_disk_write_bytes", "realAWSCloudwatch/ec2_disk_write_bytes_1ef3de.csv", "ec2-1ef3de:9100"),
]


def main(nab, out):
    families = {}
    for name, path, instance in SERIES:
        families.setdefault(name, []).append((path, instance))
    with gzip.open(out, "wt", encoding="utf-8") as f:
        for name, series in families.items():
            f.write(f"# TYPE {name} gauge\n")
            for path, instance in series:
                last = None
                with open(f"{nab}/{path}") as csv_file:
                    for row in csv.DictReader(csv_file):
                        ts = datetime.datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
                        secs = int(ts.replace(tzinfo=datetime.timezone.utc).timestamp())
                        if last is not None and secs <= last:
                            continue
                        last = secs
                        f.write(f'{name}{{instance="{instance}",job="cloudwatch"}} {row["value"]} {secs}\n')
        f.write("# EOF\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
