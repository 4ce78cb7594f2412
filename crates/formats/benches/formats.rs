//! What decoding collectors' payloads costs: `cargo bench -p vigil-formats`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn benches(c: &mut Criterion) {
    // Telegraf's `cpu` input: one line of 10 fields per CPU and host, 1,000 lines.
    let body: String = (0..1000)
        .map(|i| {
            format!(
                "cpu,cpu=cpu{},host=web-{:03} usage_user={}.5,usage_system=1.25,usage_idle=90.1,usage_nice=0,usage_iowait=0.5,\
                 usage_irq=0,usage_softirq=0.1,usage_steal=0,usage_guest=0,usage_guest_nice=0 1767225600000000000\n",
                i % 8,
                i / 8,
                i % 50
            )
        })
        .collect();
    let mapping = vigil_formats::influx::Mapping::default();
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("influx_10k_samples", |b| {
        b.iter(|| {
            let lines = vigil_formats::influx::lines(black_box(&body));
            black_box(
                lines
                    .map(|(_, l)| vigil_formats::influx::samples(l, &mapping, 0).map_or(0, |s| s.events.len()))
                    .sum::<usize>(),
            )
        })
    });
    group.finish();

    // OTLP: 100 hosts (resources) of 10 metrics of 10 CPUs' points each, as protobuf bytes
    // decoded and turned into events.
    let otlp_body = {
        use vigil_formats::otlp::*;
        let text = |s: &str| Some(AnyValue { value: Some(Any::StringValue(s.into())) });
        let resource = |h: usize| Resource {
            attributes: vec![KeyValue { key: "host.name".into(), value: text(&format!("web-{h:03}")) }],
        };
        let point = |cpu: usize| NumberDataPoint {
            attributes: vec![KeyValue { key: "cpu".into(), value: text(&format!("cpu{cpu}")) }],
            time_unix_nano: 1_767_225_600_000_000_000,
            value: Some(NumberValue::AsDouble(cpu as f64 + 0.5)),
            flags: 0,
        };
        let metric = |m: usize| Metric {
            name: format!("system.cpu.time.{m}"),
            unit: "s".into(),
            data: Some(Data::Gauge(Gauge { data_points: (0..10).map(point).collect() })),
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: (0..100)
                .map(|h| ResourceMetrics {
                    resource: Some(resource(h)),
                    scope_metrics: vec![ScopeMetrics { metrics: (0..10).map(metric).collect() }],
                })
                .collect(),
        };
        prost::Message::encode_to_vec(&request)
    };
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("otlp_10k_points", |b| {
        b.iter(|| {
            let request = vigil_formats::otlp::decode(black_box(&otlp_body), vigil_formats::otlp::Encoding::Protobuf)
                .expect("request");
            black_box(vigil_formats::otlp::samples(&request, "host.name", 0).events.len())
        })
    });
    group.finish();
}

criterion_group!(format_benches, benches);
criterion_main!(format_benches);
